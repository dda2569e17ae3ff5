// The pipelines' buffer counts and the receiver's reorder window (pipeline/pools.hpp), as
// figures for given plans: each is what a stage may hold at once, so a change here is a change
// in what the agent can keep in flight (and in its memory).
#include "pipeline/pools.hpp"

#include <gtest/gtest.h>

#include "codec/codec.hpp"
#include "wire/wire.hpp"

namespace numastream {
namespace {

Config base() {
  Config c;  // queue_depth 4, window 8, hwm 2, reorder_window 16, 11,059,200-byte chunks
  c.adaptive = false;
  return c;
}

TEST(SenderPools, HoldTheQueueEachConnectionsWindowAndTheNextChunk) {
  struct Case {
    const char* name;
    bool adaptive, spill;
    int senders;
    int spares;
    std::size_t buffers;
  };
  const Case cases[] = {
      // queue 4 + 2 senders x (window 8 + the frame in hand) + 1 for the next chunk + 1 for the
      // chunk the source compresses itself
      {"planned", false, false, 2, 0, 24},
      {"one connection", false, false, 1, 0, 15},
      // + a spare per sending thread + the 4 workers a growing CPU budget may add
      {"adaptive", true, false, 2, 2, 30},
      // + the spill's queue and the buffer its thread reads into
      {"spill", false, true, 2, 0, 29},
      {"adaptive with a spill", true, true, 2, 2, 35},
  };
  for (const auto& k : cases) {
    Config c = base();
    c.adaptive = k.adaptive;
    if (k.spill) c.spill.path = "/spill";
    const SenderPools p = plan_sender_pools(c, k.senders);
    EXPECT_EQ(p.spares, k.spares) << k.name;
    EXPECT_EQ(p.wire_buffers, k.buffers) << k.name;
    EXPECT_EQ(p.wire_capacity, wire::kHeaderSize + max_encoded_size(c.chunk_bytes)) << k.name;
  }
}

TEST(ReceiverPools, HoldWhatTheConnectionsHaveInFlightAndWhatEachSinkKeeps) {
  struct Case {
    const char* name;
    SinkConfig::Kind sink;
    bool adaptive, relay;
    std::size_t chunk_bytes;
    std::size_t window, slack, buffers;
  };
  using K = SinkConfig::Kind;
  // 2 receiving, 4 decompressing threads. Per connection in flight: 2 x hwm + 4, plus the
  // chunks (estimated at half their raw size) that fill 8 MiB of socket buffers.
  const Case cases[] = {
      // window 2 x (8 + 1) + 4 decompressors + queue 4 = 26; slack 4 + 4 = 8
      {"file sink", K::file, false, false, 11059200, 26, 8, 8 + 26 + 8},
      // the HDF5 sink writes each frame where it belongs: only the queues around it
      {"hdf5 sink", K::hdf5, false, false, 11059200, 26, 8, 8},
      {"zmq sink", K::zmq, false, false, 11059200, 26, 8, 8 + 26 + 8},
      {"no sink", K::null, false, false, 11059200, 26, 8, 0},
      // adaptive: 2 spares + 4 extra workers in the window, the slack and the pool
      {"file sink, adaptive", K::file, true, false, 11059200, 32, 14, 8 + 32 + 14 + 6},
      // a relay decodes nothing: no spares
      {"relay, adaptive", K::null, true, true, 11059200, 26, 8, 0},
      // 64 KiB chunks: 256 of them fill the socket buffers of each connection
      {"small chunks", K::file, false, false, 65536, 2 * (8 + 256) + 8, 8, 8 + 536 + 8},
      // 1 GiB chunks: none fills the socket buffers
      {"huge chunks", K::file, false, false, std::size_t{1} << 30, 2 * 8 + 8, 8, 8 + 24 + 8},
  };
  for (const auto& k : cases) {
    Config c = base();
    c.sink.kind = k.sink;
    c.adaptive = k.adaptive;
    c.relay = k.relay;
    c.chunk_bytes = k.chunk_bytes;
    const ReceiverPools p = plan_receiver_pools(c, 2, 4);
    EXPECT_EQ(p.reorder_window, k.window) << k.name;
    EXPECT_EQ(p.slack, k.slack) << k.name;
    EXPECT_EQ(p.raw_buffers, k.buffers) << k.name;
    EXPECT_EQ(
        p.raw_capacity,
        wire::kHeaderSize + (k.sink == K::hdf5 ? max_encoded_size(c.chunk_bytes) : c.chunk_bytes))
        << k.name;
  }
  Config c = base();
  c.reorder_window = 100;
  EXPECT_EQ(plan_receiver_pools(c, 1, 1).reorder_window, 100u)
      << "the configured window is the least";
}

// Consumers share a chunk's buffer, but each may hold others: the pool covers every one's queue
// and what each keeps to restore the order; an HDF5 consumer among them sizes the buffers for
// frames kept compressed.
TEST(ReceiverPools, SeveralConsumersEachHoldTheirOwn) {
  using K = SinkConfig::Kind;
  Config c = base();
  auto consumer = [](K kind) {
    ConsumerConfig k;
    k.sink.kind = kind;
    return k;
  };
  c.consumers = {consumer(K::hdf5), consumer(K::stream2), consumer(K::zmq)};
  c.sink = c.consumers.front().sink;
  const ReceiverPools p = plan_receiver_pools(c, 2, 4);
  // hwm 2 + 2, then: hdf5 its queue 4; stream2 and zmq each queue 4 + window 26 + slack 8
  EXPECT_EQ(p.raw_buffers, 4u + 4 + 2 * (4 + 26 + 8));
  EXPECT_EQ(p.raw_capacity, wire::kHeaderSize + max_encoded_size(c.chunk_bytes));
  c.consumers.pop_back();
  EXPECT_EQ(plan_receiver_pools(c, 2, 4).raw_buffers, 4u + 4 + (4 + 26 + 8))
      << "one consumer fewer";
}

}  // namespace
}  // namespace numastream
