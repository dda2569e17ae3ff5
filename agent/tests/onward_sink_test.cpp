// The onward hop (pipeline/onward_sink.hpp) against a real far receiver (run_receiver in this
// process, over IPC): what it settles upstream for each chunk it was handed.
#include "pipeline/onward_sink.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "chunks.hpp"
#include "config/config.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {
namespace {

constexpr std::uint64_t kChunks = 8;
constexpr std::size_t kBytes = 4096;

// The end frame of stream 0 after `count` frames on its one connection: kChunks of kBytes.
zmq::Message end_frame(std::uint64_t count) {
  std::byte frame[wire::kHeaderSize + wire::kEndOfStreamPayload];
  wire::Header h;
  h.type = wire::FrameType::end_of_stream;
  h.connections = 1;
  h.sequence = kChunks;
  h.payload_size = wire::kEndOfStreamPayload;
  wire::encode_header(h, frame);
  wire::encode_end_of_stream({kChunks, kChunks * kBytes, count}, frame + wire::kHeaderSize);
  return zmq::Message::of({frame, sizeof(frame)});
}

}  // namespace

// A gateway that restarted hands its hop a chunk twice: the copy an earlier process spilled for
// it (recovered: via -2) and the same chunk sent again by its sender (never acknowledged to it).
// The far receiver acknowledges the sequence once; each copy is settled, or the one left would be
// owed for ever (and the stream's end with it: the hang a fresh clone's TSan run once saw).
TEST(OnwardSink, AChunkHandedOnTwiceIsSettledForEachCopy) {
  const std::string dir = "/tmp/numastream-onward-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string far_at = "ipc://" + dir + "/far";
  const Config far = parse_config(
      {{"endpoint", far_at}, {"sink", {{"kind", "null"}}}, {"timeouts", {{"idle_s", 30}}}},
      Role::receive);
  RunResult far_result;
  std::jthread far_thread([&](std::stop_token stop) { far_result = run_receiver(far, stop); });

  const Config hop = parse_config({{"endpoint", "ipc://" + dir + "/hop"},
                                   {"sink", {{"kind", "numastream"}, {"endpoint", far_at}}}},
                                  Role::receive);
  std::mutex mu;
  std::multimap<std::uint64_t, int> acked;  // seq -> via
  const AckFn ack = [&](int via, std::uint32_t, std::uint64_t seq) {
    std::lock_guard lock(mu);
    acked.emplace(seq, via);
  };
  const AckFn discard = [](int via, std::uint32_t, std::uint64_t seq) {
    ADD_FAILURE() << "chunk " << seq << " (via " << via << ") named discarded";
  };
  zmq::Context ctx(1, {});
  OnwardSink sink(
      hop, ctx, link_options(hop, far_at, "onward", 64, std::nullopt), std::nullopt, ack, discard,
      [](std::uint32_t, std::uint64_t count, std::uint16_t, std::uint16_t) {
        return std::optional(end_frame(count));
      },
      [](std::uint32_t) { return std::string(); },
      [](std::uint32_t) {
        return std::optional(std::pair{std::uint64_t{0}, std::vector<std::uint64_t>{}});
      },
      std::make_shared<GapBook>(), [] { return false; });
  sink.start();
  StageStats st("sink");
  for (std::uint64_t seq = 0; seq < kChunks; ++seq) {
    if (seq == 3) {  // recovered from the spill first, then sent again by the sender
      Chunk recovered = testing::chunk_of(seq, kBytes);
      recovered.via = -2;
      sink.put(std::move(recovered), st);
    }
    Chunk c = testing::chunk_of(seq, kBytes);
    c.via = 0;
    sink.put(std::move(c), st);
  }
  sink.drain(st);  // ends the stream and waits until the far receiver acknowledged everything
  sink.close(false);
  far_thread.join();
  std::filesystem::remove_all(dir);

  EXPECT_EQ(far_result.exit_code, kExitOk) << far_result.summary.dump();
  EXPECT_EQ(far_result.summary.value("chunks", 0), kChunks);
  std::lock_guard lock(mu);
  EXPECT_EQ(acked.size(), kChunks + 1);
  for (std::uint64_t seq = 0; seq < kChunks; ++seq) {
    std::multiset<int> vias;
    for (auto [at, end] = acked.equal_range(seq); at != end; ++at) vias.insert(at->second);
    const std::multiset<int> want = seq == 3 ? std::multiset<int>{-2, 0} : std::multiset<int>{0};
    EXPECT_EQ(vias, want) << "chunk " << seq;
  }
}

}  // namespace numastream
