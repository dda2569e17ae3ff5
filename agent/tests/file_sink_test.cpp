// The file sink against the order its chunks and their stream's declared gaps arrive in.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "chunks.hpp"
#include "pipeline/sink.hpp"
#include "temp_dir.hpp"
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

// One process's file sink on `dir`/out.raw with a tracker of its own (a receiver started anew).
struct SinkProcess {
  explicit SinkProcess(const std::string& dir) {
    cfg.sink.kind = SinkConfig::Kind::file;
    cfg.sink.path = dir + "/out.raw";
    sink = std::make_unique<FileSink>(
        cfg, tracker, in_flight, 16, 16,
        [this](int, std::uint32_t, std::uint64_t seq) { acked.push_back(seq); },
        [](int, std::uint32_t, std::uint64_t) { ADD_FAILURE() << "discarded"; });
    EXPECT_EQ(tracker.admit_stream(0), wire::DecodeError::ok);
  }
  void put(Chunk c) {
    const std::uint64_t seq = c.header.sequence;
    ASSERT_EQ(tracker.admit(0, seq), wire::DecodeError::ok);
    ASSERT_EQ(tracker.on_chunk(0, seq, true, c.header.raw_size), StreamTracker::Verdict::delivered);
    sink->put(std::move(c), st);
  }
  Config cfg;
  StreamTracker tracker;
  InFlight in_flight;
  std::vector<std::uint64_t> acked;
  std::unique_ptr<FileSink> sink;
  StageStats st{"sink"};
};

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string bytes_of(std::initializer_list<int> chunk_bytes) {
  std::string out;
  for (int b : chunk_bytes) out.append(64, static_cast<char>(b));
  return out;
}

// A receiver killed with its sender, both started again: the new sender knows of no
// acknowledgement (none reached the old one, or it kept no record), so it resumes the stream from
// nothing. The file the old receiver wrote stays: it is confirmed chunk by chunk as the same
// chunks come again, never cut shorter than what its index recorded (before, it was started
// again from 0 bytes); bytes the old receiver wrote but never recorded are cut off once its last
// recorded chunk is confirmed. Killed again while its chunks are being confirmed, the receiver
// leaves a record of the confirmed ones only: a next receiver that a resume frame tells to trust
// its index trusts nothing unconfirmed.
TEST(FileSink, AFileAnEarlierReceiverLeftIsKeptWhileTheSameChunksComeAgain) {
  const std::string dir = temp_dir();
  const std::string part = dir + "/out.raw.part";
  {
    SinkProcess first(dir);
    for (std::uint64_t seq = 0; seq < 5; ++seq) first.put(chunk(seq));
    ASSERT_EQ(first.acked.size(), 5u);
  }                                                            // killed: no finish
  std::ofstream(part, std::ios::app) << std::string(40, 'x');  // written, never recorded
  {
    SinkProcess second(dir);
    second.put(chunk(0));
    second.put(chunk(1));
    EXPECT_EQ(second.acked, (std::vector<std::uint64_t>{0, 1}));
    EXPECT_EQ(std::filesystem::file_size(part), 5u * 64 + 40) << "the earlier chunks are kept";
    EXPECT_EQ(std::filesystem::file_size(part + ".idx"), 2u * 16) << "only confirmed ones recorded";
  }  // killed again
  {
    SinkProcess third(dir);
    for (std::uint64_t seq = 0; seq < 7; ++seq) {
      third.put(chunk(seq));
      EXPECT_GE(std::filesystem::file_size(part), std::min<std::uint64_t>(seq + 1, 2) * 64);
    }
    EXPECT_EQ(third.acked.size(), 7u);
    EXPECT_EQ(file_text(part), bytes_of({0, 1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(std::filesystem::file_size(part + ".idx"), 7u * 16);
  }
  {
    SinkProcess resumed(dir);  // told that 0..2 were acknowledged: trusts its index
    const std::vector<std::uint64_t> none;
    ASSERT_EQ(resumed.tracker.on_resume(0, 3, none), wire::DecodeError::ok);
    resumed.put(chunk(7));
    EXPECT_EQ(resumed.acked, (std::vector<std::uint64_t>{7}));
    EXPECT_EQ(file_text(part), bytes_of({0, 1, 2, 3, 4, 5, 6, 7}));
  }
  std::filesystem::remove_all(dir);
}

// A new stream to a path whose `.part` an earlier, different stream left (a failed run): the
// chunks that are byte for byte the ones there are kept, the first that differs cuts the file
// back to it, and the file ends as the new stream; one that ends before the old file does
// leaves none of it behind.
TEST(FileSink, ANewStreamCutsAnEarlierFileBackAtItsFirstDifferentChunk) {
  const std::string dir = temp_dir();
  const std::string part = dir + "/out.raw.part";
  {
    SinkProcess old(dir);
    for (std::uint64_t seq = 0; seq < 6; ++seq) old.put(chunk(seq));
  }
  {
    SinkProcess next(dir);
    next.put(chunk(0));
    next.put(chunk(1));
    next.put(testing::chunk_of(2, std::vector<std::byte>(64, std::byte{0x77})));
    EXPECT_EQ(next.acked, (std::vector<std::uint64_t>{0, 1, 2}));
    EXPECT_EQ(file_text(part), bytes_of({0, 1, 0x77}));
  }
  {
    SinkProcess same_start(dir);  // the same first chunk, and no more: the rest goes at finish
    same_start.put(chunk(0));
    same_start.sink->finish();
    EXPECT_EQ(file_text(part), bytes_of({0}));
  }
  {
    SinkProcess shorter(dir);  // its first chunk differs already
    shorter.put(testing::chunk_of(0, std::vector<std::byte>(32, std::byte{0x55})));
    EXPECT_EQ(file_text(part), std::string(32, '\x55'));
  }
  {
    SinkProcess gapped(dir);  // an earlier stream whose first chunks were declared gone
    const std::vector<wire::Gap> gap = {{0, 2, wire::GapReason::sender_restarted}};
    ASSERT_EQ(gapped.tracker.on_gaps(0, gap), wire::DecodeError::ok);
    gapped.put(chunk(2));
    EXPECT_EQ(file_text(part), bytes_of({2}));
  }
  {
    SinkProcess from_zero(dir);  // a new stream's chunk 0 is not one the earlier file passed over
    from_zero.put(chunk(0));
    EXPECT_EQ(from_zero.acked, (std::vector<std::uint64_t>{0}));
    EXPECT_EQ(file_text(part), bytes_of({0}));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace numastream
