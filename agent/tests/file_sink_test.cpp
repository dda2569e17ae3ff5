// The file sink against the order its chunks and their stream's declared gaps arrive in.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "chunks.hpp"
#include "pipeline/sink.hpp"
#include "wire/tracker.hpp"

namespace numastream {
namespace {

Chunk chunk(std::uint64_t seq) { return testing::chunk_of(seq, 64); }

// A sender resuming a live source declares what an earlier sender took and never had
// acknowledged; its connections may carry later chunks before that declaration reaches the
// gateway. The sink holding them (it waits for the first missing one) writes them once the gap
// is known, though no chunk comes after it: the sender waits for their acknowledgements, so none
// would (before, both waited until the sender gave up after 60 s).
TEST(FileSink, ChunksHeldForAGapDeclaredAfterThemAreWrittenWithoutAnotherChunk) {
  char tmpl[] = "/tmp/numastream-file-sink-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Config cfg;
  cfg.sink.kind = SinkConfig::Kind::file;
  cfg.sink.path = dir + "/out.raw";
  StreamTracker tracker;
  InFlight in_flight;
  std::vector<std::uint64_t> acked;
  AckFn ack = [&](int, std::uint32_t, std::uint64_t seq) { acked.push_back(seq); };
  AckFn discard = [](int, std::uint32_t, std::uint64_t) {};
  FileSink sink(cfg, tracker, in_flight, 16, 16, ack, discard);
  StageStats st("sink");
  ASSERT_EQ(tracker.admit_stream(0), wire::DecodeError::ok);
  for (std::uint64_t seq : {3, 4, 5}) {
    ASSERT_EQ(tracker.admit(0, seq), wire::DecodeError::ok);
    ASSERT_EQ(tracker.on_chunk(0, seq, true, 64), StreamTracker::Verdict::delivered);
    sink.put(chunk(seq), st);
  }
  EXPECT_TRUE(acked.empty()) << "chunks 0..2 may still come";
  const std::vector<wire::Gap> gap = {{0, 3, wire::GapReason::sender_restarted}};
  ASSERT_EQ(tracker.on_gaps(0, gap), wire::DecodeError::ok);
  sink.idle(st);  // the queue is empty: no chunk will come before these are acknowledged
  EXPECT_EQ(acked, (std::vector<std::uint64_t>{3, 4, 5}));
  EXPECT_EQ(std::filesystem::file_size(cfg.sink.path + ".part"), 3u * 64u);
  sink.finish();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace numastream
