// How many buffers each pipeline's pools hold, and the receiver's reorder window: pure functions
// of the configuration and the planned threads, so the sizing is one place, tested by itself, and
// the same for every pipeline that declares those stages. Internal to the agent.
#pragma once

#include <cstddef>

#include "config/config.hpp"

namespace numastream {

// The sender: compressed chunks travel in "wire" buffers from the compressors to the wire.
struct SenderPools {
  int spares = 0;                 // adaptive: spare compressing threads (one per sending thread)
  std::size_t wire_buffers = 0;   // per NUMA node the compressors run on
  std::size_t wire_capacity = 0;  // bytes: a header and the worst-case encoded chunk
};

// Buffers held downstream of the compressors: the ordered queue, each connection's window of
// unacknowledged frames and the frame its sending thread holds, one for the compressor holding
// the next chunk; a spill's queue and the buffer its thread reads into; adaptive, the spares and
// the workers a growing CPU budget may add.
SenderPools plan_sender_pools(const Config& cfg, int senders);

// The receiver: decoded chunks travel in "raw" buffers from the decompressors to the sink.
struct ReceiverPools {
  int spares = 0;  // adaptive: spare decompressing threads (one per receiving thread)
  int room = 0;    // adaptive: the spares and the extra workers a CPU budget may add
  std::size_t reorder_window = 0;  // chunks the file sink holds to restore the order
  std::size_t slack = 0;           // what the decompressors and the sink's queue may hold beyond it
  std::size_t raw_buffers = 0;     // per NUMA node the decompressors run on
  std::size_t raw_capacity = 0;    // bytes: a header and a chunk as the sink takes it
};

// The reorder window holds what several connections have in flight at once (ZeroMQ's queues on
// both ends, ~8 MiB of socket buffers, a frame being decoded) and what the decompressors finish
// out of order, and at least cfg.reorder_window. The file sink holds up to window + slack; the
// HDF5 sink writes each frame where it belongs and holds none; the zmq sink holds what ZeroMQ has
// not sent. The HDF5 sink takes bslz4 frames as they arrived: raw buffers fit the worst case.
ReceiverPools plan_receiver_pools(const Config& cfg, int receivers, int decompressors);

// The bytes an agent with this configuration allocates for its buffer pools at start (and
// pre-faults) on each NUMA node its codec stage runs on, with the threads its placement names
// (placement.stages; the defaults where it names none): what its container's memory must hold
// besides the program (`numastream-agent check-config` prints it; the operator's contract test
// compares it with the memory it gives the container).
std::size_t planned_pool_bytes(const Config& cfg);

}  // namespace numastream
