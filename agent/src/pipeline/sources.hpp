// Where a sender's chunks come from: synthetic projections, files, an HDF5 dataset, or an
// upstream ZeroMQ socket. The source stage asks its Source for chunk after chunk; the compressing
// stage reads the bytes it names. Internal to the agent.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/mapped_file.hpp"
#include "codec/codec.hpp"
#include "config/config.hpp"
#include "data/buffer_pool.hpp"
#include "net/transport.hpp"
#include "obs/registry.hpp"
#include "obs/stats.hpp"
#include "store/hdf5_io.hpp"

namespace numastream {

// One chunk as the source produced it, before compression.
struct RawChunk {
  std::uint64_t seq = 0;
  int frame = 0;        // synthetic: which projection (each compressing node has its own copy)
  PooledBuffer buffer;  // file, hdf5: the bytes read
  // file: the chunk's bytes where the file is mapped (no copy; `buffer` then only holds its place
  // among the chunks in flight). Whoever reads them asks mapped.file()->cut_short() after.
  MappedView mapped;
  std::optional<zmq::Message> message;  // zmq, stream2: the message as ZeroMQ received it
  // Sent as they came, never decoded or recompressed here, their checksum over those bytes: an
  // HDF5 chunk stored with bslz4 (`stored`), a detector's message (stored none). `raw_size` is
  // what they stand for in the stream's raw totals (what a bslz4 chunk decodes to).
  bool as_is = false;
  Codec stored = Codec::none;
  std::size_t raw_size = 0;
};

class Source {
 public:
  virtual ~Source() = default;
  // What the chunks are: pixel type and frame shape (the stream's metadata frame).
  virtual hdf5::FrameShape shape() const = 0;
  // Finite (a file, a dataset, a chunk count): a drain pauses such a stream instead of ending it.
  virtual bool has_end() const = 0;
  // Chunks can be produced again by sequence number, so a restarted sender skips what the
  // receiver acknowledged and resends the rest. A live source (zmq) cannot.
  virtual bool replays() const { return true; }
  // Fills chunk `c.seq` (the next one). False at the end of the source, or when `stop` says so
  // while a live source waits. Throws on I/O errors and on chunks larger than chunk_bytes.
  // `st` receives the time spent waiting for input and working.
  virtual bool read(RawChunk& c, StageStats& st, const std::function<bool()>& stop) = 0;
  // Steps over chunk `seq`, which an earlier receiver already has. Returns its raw bytes (for
  // the stream's totals), 0 at the end of the source.
  virtual std::size_t skip(std::uint64_t seq) = 0;
  // The raw bytes of chunk `c` for the compressing thread on NUMA node `node`.
  virtual std::span<const std::byte> bytes(const RawChunk& c, int node) const {
    (void)node;
    if (c.message) return c.message->bytes();
    if (c.mapped) return c.mapped.bytes();
    return {c.buffer->data, c.buffer->size};
  }
  // A live source: since when it has waited for a message with none there (a drain waits for
  // the detector to pause); now when it is not waiting. Time the sender spends elsewhere (its
  // queues full behind a slow gateway) is not the detector's silence: messages may wait in the
  // socket meanwhile.
  virtual std::chrono::steady_clock::time_point waiting_since() const {
    return std::chrono::steady_clock::now();
  }
  // Shutdown: wakes whatever waits on the source's buffers.
  virtual void close() {}
  // The source thread is done with the source: what it opened for that thread (a socket) is
  // closed here, by that thread.
  virtual void end() {}
  // What the source counted (messages, series, malformed input), into the run's summary and
  // its metrics.
  virtual void report(nlohmann::json& /*summary*/) const {}
  // Declares the source's own metric families.
  virtual void declare_metrics(MetricRegistry& /*m*/) const {}
};

struct SourceSetup {
  const Config& cfg;
  std::vector<int> compress_nodes;  // NUMA nodes of the compressing threads (synthetic copies)
  int source_node = -1;             // NUMA node of the source thread (its read buffers)
  std::size_t buffers = 0;          // read buffers: what the queue and the compressors can hold
  std::function<void(const std::string&)> log;
};

// The source the configuration names (a zmq source makes its socket in `ctx`). Throws
// ConfigError naming the field when it cannot open.
std::unique_ptr<Source> make_source(const SourceSetup& setup, zmq::Context& ctx);

}  // namespace numastream
