// The sender as one class: a source stage reads chunks (sender_source.cpp), compressing
// threads encode them, sending threads put them on the wire under acknowledged delivery, and a
// spill (sender_spill.cpp) holds what the receiver cannot take yet from a source that cannot
// wait (sender.cpp runs it). Internal to the agent: run_sender (pipeline.hpp) is its interface.
#pragma once
#include <fcntl.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "codec/codec.hpp"
#include "codec/synth.hpp"
#include "data/buffer_pool.hpp"
#include "data/queue.hpp"
#include "data/spill.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "obs/http.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/governor.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/pools.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sources.hpp"
#include "store/hdf5_io.hpp"
#include "store/state.hpp"
#include "wire/wire.hpp"

namespace numastream {

class Sender {
 public:
  using Clock = std::chrono::steady_clock;
  Sender(const Config& cfg, std::stop_token stop)
      : cfg_(cfg), rt_(cfg, std::move(stop)), endpoint_(parse_endpoint(cfg.endpoint, "endpoint")) {}

  RunResult run(const RunHooks& hooks);

 private:
  // A duration for people: 3 significant digits.
  static std::string seconds(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", s);
    return b;
  }
  void prepare_source();
  // The stage threads' bodies (run by Runtime::run_stage).
  void source_loop(StageThread& t);
  void compress_loop(StageThread& t);
  wire::Header data_header(const RawChunk& c, std::span<const std::byte> raw,
                           bool sum = true) const;
  bool hand_on(RawChunk& c, StageThread& t);
  // The compressing stage's work on one chunk, counted as that stage's (chunks, bytes): `out`
  // (its buffer taken) framed from `c`.
  void compress_into(const RawChunk& c, Chunk& out, Compressor& comp, wire::ChecksumStream& sum,
                     int node);
  bool compress_here(RawChunk& c, StageThread& t);
  // An uncompressed chunk of at most this many bytes is framed by the source itself: below it,
  // the hand-off to a compressing thread costs more than the copy and the checksum
  // (docs/performance.md: 1.25x the rate at 16 KiB, 1.11x at 64; none at 256).
  static constexpr std::size_t kFramedHere = 64 << 10;
  bool skip_acknowledged(std::uint64_t seq);
  void log_drain(Clock::time_point from, std::uint64_t seq) const;
  void greet(AckedLink& link);
  void send_chunk(AckedLink& link, Chunk& c, StageThread& t);
  void send_loop(StageThread& t);
  LinkOptions send_link_options(int index) const;
  void declare_discarded(std::uint32_t stream, std::span<const std::uint64_t> seqs);
  void end_stream(AckedLink& link, int index, std::uint64_t on_connection, StageStats& st);
  // What run() is made of: the state an earlier sender left, what one run holds, the spill, the
  // graph, the state recorder, the summary.
  void load_state();
  void build(int compressors, int senders);
  void open_spill();
  void declare_graph(StageGraph& graph, int compressors, int senders);
  std::jthread start_recorder();
  nlohmann::json summary();
  // spill: between the compressors and the sending threads (see spill_loop).
  void spill_loop();
  bool unspill(BufferPool& pool, bool wait);
  std::optional<Chunk> next_to_send(std::chrono::milliseconds timeout, bool& done,
                                    SpinBudget* spin) {
    return spill_.queue ? spill_.queue->pop_for(timeout, done, spin)
                        : wire_q_->pop_for(timeout, done, spin);
  }
  // A source that can wait for the pipeline (a file or synthetic data at full speed): a full
  // spill holds it back. Any other (a detector, a paced source) loses what a full spill refuses.
  bool source_can_wait() const { return source_->replays() && cfg_.source.rate_gbps == 0; }
  bool wait_welcome();
  // A file, or synthetic data with a chunk count: a drain pauses such a stream instead of
  // ending it short.
  bool source_has_end() const { return source_->has_end(); }
  // A drain pauses the stream (it stays open at the receiver and resumes with the next sender)
  // unless a person ended an endless stream with SIGINT.
  bool drain_pauses() const {
    return rt_.drain_requested() && !end_.source_ended &&
           (source_has_end() || drain_signal() != SIGINT);
  }
  bool drain_done(std::optional<Clock::time_point>& from);
  void declare_metrics();

  const Config& cfg_;
  Runtime rt_;
  Endpoint endpoint_;
  std::size_t wire_capacity_ = 0;

  // Declaration order is destruction order in reverse: the ZeroMQ context (which may still hold
  // zero-copy messages) goes before the pools their buffers return to.
  std::unique_ptr<Source> source_;
  // What the source's data is: bytes per sample (bslz4), and the stream's metadata frame (pixel
  // type and frame shape).
  struct StreamShape {
    std::size_t element_size = 2;
    std::string metadata;
  } stream_;
  // How the source ended: its stage is done; it ended the stream itself (not stopped by a drain);
  // the chunks read when a drain began; the drain ended at source.drain_s, the detector still
  // sending.
  struct SourceEnd {
    std::atomic<bool> source_done{false};
    std::atomic<bool> source_ended{false};
    std::uint64_t drain_seq = 0;
    bool drain_cut = false;
  } end_;
  std::unique_ptr<NodePools> wire_pools_;
  std::unique_ptr<BoundedQueue<RawChunk>> raw_q_;
  std::unique_ptr<OrderedQueue<Chunk>> wire_q_;
  // spill (cfg_.spill): the store on node-local storage and the queue the sending threads take
  // from (both only with a spill), and what went through them.
  struct Spill {
    std::unique_ptr<SpillStore> store;
    std::unique_ptr<BoundedQueue<Chunk>> queue;
    std::atomic<std::uint64_t> chunks{0};
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint64_t> lost{0};
    std::uint64_t disk_full = 0;  // of those, refused for want of disk space
    std::atomic<std::uint64_t> disk_bytes{0};
    std::atomic<std::uint64_t> frames{0};
    std::atomic<std::uint64_t> peak_bytes{0};
  } spill_;
  std::unique_ptr<zmq::Context> ctx_;

  // placement.adaptive: spare compressing threads on the sending threads' CPUs, and what sets
  // them to work (pipeline/governor.hpp).
  adaptive::CodecSpares spares_;
  // What the stages did, for the metrics and the summary.
  struct SendCounts {
    std::atomic<std::uint64_t> produced_chunks{0};
    std::atomic<std::uint64_t> produced_bytes{0};
    std::atomic<std::uint64_t> wire_bytes{0};
    std::atomic<std::uint64_t> sent_chunks{0};
    std::atomic<std::int64_t> first_chunk_ns{-1};
    std::atomic<std::int64_t> last_send_ns{0};
    std::uint64_t skipped_chunks = 0;
    std::atomic<std::uint64_t> retransmitted{0};
    // Frames written with the payload in a part of its own (uncopied), and payloads copied into
    // whole frames for a receiver that does not take two parts.
    std::atomic<std::uint64_t> two_part{0};
    std::atomic<std::uint64_t> made_whole{0};
    std::atomic<int> reconnects{0};
    std::atomic<std::uint64_t> discarded{0};             // notices of chunks the gateway discarded
    std::atomic<std::uint64_t> compressed_by_source{0};  // compress_here
  } counts_;
  // The source's own compressor, made the first time it helps (compress_here).
  struct Helper {
    Helper(const Config& cfg, int element_size)
        : comp(cfg.codec, cfg.acceleration, cfg.chunk_bytes, element_size) {}
    Compressor comp;
    wire::ChecksumStream sum;
  };
  std::unique_ptr<Helper> helper_;

  // Acknowledged delivery: what the receiver has taken, shared by the connections. The source
  // starts once a connection has the receiver's answer to its resume frame (a restarted sender
  // learns there what to skip).
  std::shared_ptr<AckLedger> ledger_ = std::make_shared<AckLedger>();
  std::shared_ptr<GapBook> gap_book_ = std::make_shared<GapBook>();
  // The records on the node (state_dir) and what an earlier sender left in them.
  struct Records {
    std::unique_ptr<StreamState> state;   // the acknowledged record
    std::unique_ptr<TakenRecord> taken;   // a live source's: how many chunks its senders took
    std::uint64_t floor = 0;              // what an earlier sender recorded
    std::uint64_t declared_at_start = 0;  // chunks of earlier senders declared missing
    std::vector<std::uint64_t>
        recovered;  // ascending: an earlier sender's spilled chunks, sent first
  } records_;
  std::uint64_t start_live();
  void save_state();
  std::optional<CurveSetup> curve_;
  // Opened once a connection has the receiver's welcome; the source and the spill wait for it.
  class Welcome {
   public:
    void open() {
      {
        std::lock_guard lock(mu_);
        open_ = true;
      }
      cv_.notify_all();
    }
    // False when `aborted` says so first.
    template <class Aborted>
    bool wait(Aborted aborted) {
      std::unique_lock lock(mu_);
      while (!open_ && !aborted()) cv_.wait_for(lock, std::chrono::milliseconds(100));
      return open_ && !aborted();
    }

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool open_ = false;
  } welcome_;
};

}  // namespace numastream
