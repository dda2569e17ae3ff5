#include "pipeline/pools.hpp"

#include <algorithm>
#include <vector>

#include "codec/codec.hpp"
#include "pipeline/governor.hpp"
#include "wire/wire.hpp"

namespace numastream {

SenderPools plan_sender_pools(const Config& cfg, int senders) {
  SenderPools p;
  p.spares = cfg.adaptive ? senders : 0;
  p.wire_capacity = wire::kHeaderSize + max_encoded_size(cfg.chunk_bytes);
  const auto count = [](int n) { return static_cast<std::size_t>(n); };
  // + 2: the ordered queue's one item beyond its capacity, and the chunk the source compresses
  // itself when the compressing threads' queue is full (Sender::compress_here).
  p.wire_buffers = count(cfg.queue_depth) + count(senders) * count(cfg.window + 1) + 2 +
                   count(p.spares) + count(p.spares > 0 ? adaptive::ExtraWorkers::kMax : 0) +
                   count(cfg.spill.enabled() ? cfg.queue_depth + 1 : 0);
  return p;
}

ReceiverPools plan_receiver_pools(const Config& cfg, int receivers, int decompressors) {
  ReceiverPools p;
  p.spares = cfg.adaptive && !cfg.relay && decompressors > 0 ? receivers : 0;
  p.room = p.spares + (p.spares > 0 ? adaptive::ExtraWorkers::kMax : 0);
  const std::size_t wire_estimate = std::max<std::size_t>(1, cfg.chunk_bytes / 2);
  const std::size_t per_connection =
      static_cast<std::size_t>(2 * cfg.hwm + 4) + (8u << 20) / wire_estimate;
  p.reorder_window = std::max<std::size_t>(static_cast<std::size_t>(cfg.reorder_window),
                                           static_cast<std::size_t>(receivers) * per_connection +
                                               static_cast<std::size_t>(decompressors) +
                                               static_cast<std::size_t>(p.room) +
                                               static_cast<std::size_t>(cfg.queue_depth));
  p.slack = static_cast<std::size_t>(decompressors) + static_cast<std::size_t>(p.room) +
            static_cast<std::size_t>(cfg.queue_depth);
  // What the consumers may hold at once: each its queue, and what a file or Stream V2 sink holds
  // to restore the order (an HDF5 sink writes each chunk where it belongs). Consumers share the
  // buffers of a chunk, but each may be holding other chunks.
  std::vector<SinkConfig> sinks;
  for (const auto& k : cfg.consumers) sinks.push_back(k.sink);
  if (sinks.empty() && cfg.sink.kind != SinkConfig::Kind::null) sinks.push_back(cfg.sink);
  bool hdf5 = false;
  std::size_t held = 0;
  for (const auto& s : sinks) {
    hdf5 = hdf5 || s.kind == SinkConfig::Kind::hdf5;
    held += static_cast<std::size_t>(cfg.queue_depth) +
            (s.kind == SinkConfig::Kind::hdf5 ? 0 : p.reorder_window + p.slack);
  }
  p.raw_buffers = (sinks.empty() ? 0 : static_cast<std::size_t>(cfg.hwm + 2) + held) +
                  static_cast<std::size_t>(p.room);
  p.raw_capacity = wire::kHeaderSize + (hdf5 ? max_encoded_size(cfg.chunk_bytes) : cfg.chunk_bytes);
  return p;
}

std::size_t planned_pool_bytes(const Config& cfg) {
  auto threads = [&](Stage stage, int otherwise) {
    auto it = cfg.stages.find(stage);
    return it != cfg.stages.end() && it->second.threads > 0 ? it->second.threads : otherwise;
  };
  if (cfg.role == Role::send) {
    const SenderPools p = plan_sender_pools(cfg, cfg.connections);
    return (p.wire_buffers + static_cast<std::size_t>(threads(Stage::compress, 1))) *
           p.wire_capacity;
  }
  if (cfg.relay) return 0;  // a relay decodes nothing: frames stay in the messages they came in
  const int decompressors = threads(Stage::decompress, 1);
  const ReceiverPools p =
      plan_receiver_pools(cfg, threads(Stage::receive, cfg.connections), decompressors);
  return (p.raw_buffers + static_cast<std::size_t>(decompressors)) * p.raw_capacity;
}

}  // namespace numastream
