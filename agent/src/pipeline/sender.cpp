// The send pipeline: source -> compress xC -> send xS.
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
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", s);
  return b;
}

class Sender {
 public:
  Sender(const Config& cfg, std::stop_token stop)
      : cfg_(cfg), rt_(cfg, std::move(stop)), endpoint_(parse_endpoint(cfg.endpoint, "endpoint")) {}

  RunResult run(const RunHooks& hooks);

 private:
  void prepare_source();
  // The stage threads' bodies (run by Runtime::run_stage).
  void source_loop(StageThread& t);
  void compress_loop(StageThread& t);
  void send_loop(StageThread& t);
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
  std::optional<Chunk> next_to_send(std::chrono::milliseconds timeout, bool& done) {
    return send_q_ ? send_q_->pop_for(timeout, done) : wire_q_->pop_for(timeout, done);
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
    return rt_.drain_requested() && !source_ended_ &&
           (source_has_end() || drain_signal() != SIGINT);
  }
  bool drain_done(std::optional<Clock::time_point>& from);
  std::atomic<bool> source_ended_{false};
  std::uint64_t drain_seq_ = 0;  // the chunks read when a drain began
  bool drain_cut_ = false;       // the drain ended at source.drain_s, the detector still sending
  void declare_metrics();

  const Config& cfg_;
  Runtime rt_;
  Endpoint endpoint_;
  std::size_t wire_capacity_ = 0;

  // Declaration order is destruction order in reverse: the ZeroMQ context (which may still hold
  // zero-copy messages) goes before the pools their buffers return to.
  std::unique_ptr<Source> source_;
  std::size_t element_size_ = 2;  // bytes per sample (bslz4)
  std::string metadata_;          // the stream's metadata frame: pixel type and frame shape
  std::unique_ptr<NodePools> wire_pools_;
  std::unique_ptr<BoundedQueue<RawChunk>> raw_q_;
  std::unique_ptr<OrderedQueue<Chunk>> wire_q_;
  // spill (cfg_.spill): the store on node-local storage and the queue the sending threads take
  // from; both only with a spill.
  std::unique_ptr<SpillStore> spill_;
  std::unique_ptr<BoundedQueue<Chunk>> send_q_;
  std::atomic<std::uint64_t> spilled_chunks_{0};
  std::atomic<std::uint64_t> spilled_bytes_{0};
  std::atomic<std::uint64_t> spill_lost_{0};
  std::uint64_t spill_disk_full_ = 0;  // of those, refused for want of disk space
  std::atomic<std::uint64_t> spill_disk_bytes_{0};
  std::atomic<std::uint64_t> spill_frames_{0};
  std::atomic<std::uint64_t> spill_peak_bytes_{0};
  std::unique_ptr<zmq::Context> ctx_;

  // placement.adaptive: spare compressing threads on the sending threads' CPUs, and what sets
  // them to work (pipeline/governor.hpp).
  int spares_ = 0;
  std::unique_ptr<adaptive::Governor> governor_;
  std::unique_ptr<adaptive::ExtraWorkers> extra_;  // compressors started when the CPU budget grows
  std::unique_ptr<adaptive::Controller> controller_;
  std::atomic<std::uint64_t> produced_chunks_{0};
  std::atomic<std::uint64_t> produced_bytes_{0};
  std::atomic<std::uint64_t> wire_bytes_{0};
  std::atomic<std::uint64_t> sent_chunks_{0};
  std::atomic<bool> source_done_{false};
  std::atomic<std::int64_t> first_chunk_ns_{-1};
  std::atomic<std::int64_t> last_send_ns_{0};

  // Acknowledged delivery: what the receiver has taken, shared by the connections. The source
  // starts once a connection has the receiver's answer to its resume frame (a restarted sender
  // learns there what to skip).
  std::shared_ptr<AckLedger> ledger_ = std::make_shared<AckLedger>();
  std::unique_ptr<StreamState> state_;  // the acknowledged record on the node (state_dir)
  std::unique_ptr<TakenRecord> taken_;  // a live source's: how many chunks its senders took
  std::shared_ptr<GapBook> gap_book_ = std::make_shared<GapBook>();
  std::uint64_t declared_at_start_ = 0;  // chunks of earlier senders declared missing
  std::vector<std::uint64_t>
      recovered_seqs_;  // ascending: an earlier sender's spilled chunks, sent first
  std::uint64_t start_live();
  std::uint64_t state_floor_ = 0;  // what an earlier sender recorded
  void save_state();
  std::optional<CurveSetup> curve_;
  std::mutex welcome_mu_;
  std::condition_variable welcome_cv_;
  bool welcomed_ = false;
  std::uint64_t skipped_chunks_ = 0;
  std::atomic<std::uint64_t> retransmitted_{0};
  // Frames written with the payload in a part of its own (uncopied), and payloads copied into
  // whole frames for a receiver that does not take two parts.
  std::atomic<std::uint64_t> two_part_{0}, made_whole_{0};
  std::atomic<int> reconnects_{0};
  std::atomic<std::uint64_t> discarded_{0};  // notices of chunks the gateway discarded
};

bool Sender::wait_welcome() {
  std::unique_lock lock(welcome_mu_);
  while (!welcomed_ && !rt_.aborted()) welcome_cv_.wait_for(lock, std::chrono::milliseconds(100));
  return welcomed_ && !rt_.aborted();
}

void Sender::prepare_source() {
  SourceSetup setup{
      cfg_, rt_.stage_nodes(Stage::compress), rt_.placement.stage(Stage::source).front().numa_node,
      static_cast<std::size_t>(cfg_.queue_depth + rt_.threads(Stage::compress) + 1), log_line};
  source_ = make_source(setup, *ctx_);
  const hdf5::FrameShape shape = source_->shape();
  element_size_ = dtype_size(shape.dtype);
  nlohmann::json meta{{"dtype", shape.dtype}, {"shape", shape.dims}};
  // A raw zmq source: frames it queued for a sender that died are counted by no one (the
  // gateway says its losses are a lower bound then).
  if (cfg_.source.kind == SourceConfig::Kind::zmq) meta["source"] = "zmq";
  metadata_ = meta.dump();
}

void Sender::source_loop(StageThread& t) {
  StageStats& st = t.stats;
  Clock::time_point pace_start;
  const double interval_s =
      cfg_.source.rate_gbps > 0 ? cfg_.chunk_bytes * 8.0 / (cfg_.source.rate_gbps * 1e9) : 0;
  std::uint64_t seq = 0;
  std::optional<std::uint64_t> paced_from;
  if (!wait_welcome()) return;
  const std::uint32_t stream = cfg_.stream_id;
  if (ledger_->acknowledged(stream) > 0) {
    log_line("resuming stream " + std::to_string(stream) + ": the receiver already has " +
             std::to_string(ledger_->acknowledged(stream)) + " chunks");
  }
  // A live source numbers on after its earlier senders, before it reads anything: a stream ended
  // before a chunk came still ends at the right total.
  if (!source_->replays()) {
    seq = start_live();
    produced_chunks_ = seq;
  }
  // A drain stops a replaying source at once (the next sender resumes it from the source). A
  // live one reads on until the detector pauses or source.drain_s passes (see drain_done).
  std::optional<Clock::time_point> drain_from;
  auto stop = [&] {
    if (rt_.aborted()) return true;
    if (!rt_.drain_requested()) return false;
    if (source_->replays()) return true;
    return drain_done(drain_from);
  };
  while (!stop()) {
    RawChunk c;
    c.seq = seq;
    // Already acknowledged (this sender restarted): skipped, its bytes still counted in the
    // stream's totals.
    if (source_->replays() && ledger_->contains(stream, seq)) {
      const std::size_t size = source_->skip(seq);
      if (size == 0) break;
      wire_q_->skip(seq);
      ++seq;
      ++skipped_chunks_;
      produced_bytes_ += size;
      produced_chunks_ = seq;
      continue;
    }
    // Paced from the first chunk this sender sends: skipped ones take no time.
    if (interval_s > 0) {
      if (!paced_from) {
        paced_from = seq;
        pace_start = Clock::now();
      }
      ScopedTimer wait(st.blocked_input_ns);
      std::this_thread::sleep_until(
          pace_start + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>((seq - *paced_from) * interval_s)));
    }
    if (!source_->read(c, st, stop)) {
      // Ended by the source itself (an empty message from a zmq detector), not by a stop: the
      // stream ends, even during a drain.
      source_ended_ = !stop();
      break;
    }
    // Counted taken before it enters the pipeline: if this sender dies, the next one knows.
    if (taken_) taken_->taken(seq + 1);
    const std::size_t size = c.message  ? c.message->bytes().size()
                             : c.buffer ? c.buffer->size
                                        : cfg_.chunk_bytes;
    const std::size_t raw = c.as_is ? c.raw_size : size;
    {
      ScopedTimer wait(st.blocked_output_ns);
      if (!raw_q_->push(c)) break;
    }
    ++seq;
    st.chunks++;
    st.bytes_out += size;
    produced_bytes_ += raw;
    produced_chunks_ = seq;
    t.observe();
  }
  if (drain_from) {
    const double secs = std::chrono::duration<double>(Clock::now() - *drain_from).count();
    log_line(
        "drain: " + std::to_string(seq - drain_seq_) + " chunks read from the detector in " +
        seconds(secs) + " s after the stop was asked; " +
        (source_ended_ ? std::string("the detector ended the stream")
         : drain_cut_
             ? "the detector did not pause within source.drain_s (" + seconds(cfg_.source.drain_s) +
                   " s): what it had in transit is lost (a stream2 gateway names the image ids)"
             : "the detector paused: nothing was in transit"));
  }
}

// A live source during a drain: done once the detector has sent nothing for
// source.drain_quiet_ms (nothing is in transit then), or source.drain_s after the drain began.
bool Sender::drain_done(std::optional<Clock::time_point>& from) {
  const auto now = Clock::now();
  if (!from) {
    from = now;
    drain_seq_ = produced_chunks_.load();
    log_line("drain: reading the detector until it pauses (" +
             std::to_string(cfg_.source.drain_quiet_ms) + " ms without a message) or " +
             seconds(cfg_.source.drain_s) + " s pass");
  }
  if (now - std::max(source_->last_input(), *from) >=
      std::chrono::milliseconds(cfg_.source.drain_quiet_ms))
    return true;
  if (now - *from >= std::chrono::duration<double>(cfg_.source.drain_s)) {
    drain_cut_ = true;
    return true;
  }
  return false;
}

// `gaps` (ascending, disjoint) without the chunks `seqs` (ascending) names.
std::vector<wire::Gap> without(const std::vector<wire::Gap>& gaps,
                               const std::vector<std::uint64_t>& seqs) {
  std::vector<wire::Gap> out;
  for (const auto& g : gaps) {
    std::uint64_t at = g.first;
    for (auto it = std::lower_bound(seqs.begin(), seqs.end(), g.first);
         it != seqs.end() && *it < g.end; ++it) {
      if (*it > at) out.push_back({at, *it, g.reason});
      at = *it + 1;
    }
    if (at < g.end) out.push_back({at, g.end, g.reason});
  }
  return out;
}

// A live source cannot replay. Its sender numbers on after every chunk an earlier sender of the
// stream took (its taken record) or the receiver has, and declares what earlier senders took and
// never had acknowledged as a gap: the receiver counts those chunks missing and names them.
std::uint64_t Sender::start_live() {
  const std::uint32_t stream = cfg_.stream_id;
  auto [floor, above] = ledger_->snapshot(stream);
  std::uint64_t start = ledger_->end(stream);
  const auto earlier = taken_ ? taken_->earlier() : std::nullopt;
  if (earlier) start = std::max(start, earlier->at_most);
  if (!recovered_seqs_.empty()) start = std::max(start, recovered_seqs_.back() + 1);
  if (start == 0) return 0;
  const auto reason = earlier && !earlier->exact ? wire::GapReason::sender_restarted_bound
                                                 : wire::GapReason::sender_restarted;
  std::vector<wire::Gap> gaps;
  std::uint64_t at = floor;
  for (auto q : above) {  // ascending
    if (q >= start) break;
    if (q > at) gaps.push_back({at, q, reason});
    at = q + 1;
  }
  if (at < start) gaps.push_back({at, start, reason});
  gaps = without(gaps, recovered_seqs_);  // those come from the spill
  wire_q_->start_at(start);
  std::uint64_t missing = 0;
  for (const auto& g : gaps) missing += g.size();
  if (!earlier && missing > 0) {
    // No record of what the earlier sender took: the gap is what the receiver has not, below what
    // it has; chunks the earlier sender held above that are not known to anyone.
    log_warn("resuming a live source at chunk " + std::to_string(start) +
             " without a state_dir: chunks an "
             "earlier sender took after chunk " +
             std::to_string(start - 1) + " are not known to anyone");
  }
  if (!gaps.empty()) {
    if (!gap_book_->add(stream, gaps))
      throw std::runtime_error("more than " + std::to_string(wire::kMaxGapRecords) +
                               " separate gaps in stream " + std::to_string(stream));
    ledger_->settle(stream, gaps);
  }
  declared_at_start_ = missing;
  log_warn("resuming a live source at chunk " + std::to_string(start) + ": " +
           std::to_string(missing) +
           " chunks an earlier sender took were never acknowledged; declared missing" +
           (reason == wire::GapReason::sender_restarted_bound
                ? " (at most; the node restarted since it counted them)"
                : "") +
           (gaps.empty() ? std::string()
                         : ", first " + std::to_string(gaps.front().first) + ", last " +
                               std::to_string(gaps.back().end - 1)));
  return start;
}

void Sender::compress_loop(StageThread& t) {
  const int node = t.numa_node;
  StageStats& st = t.stats;
  Compressor comp(cfg_.codec, cfg_.acceleration, cfg_.chunk_bytes, element_size_);
  BufferPool& pool = wire_pools_->for_node(node);
  while (true) {
    // Between chunks: a parked thread (placement.adaptive) waits here for its turn.
    if (governor_ && !governor_->wait_turn(t.index)) break;
    std::optional<RawChunk> c = t.next(*raw_q_);
    if (!c) break;
    Chunk out;
    // Sent as it came, in the message it came in (a detector's): no buffer, nothing copied.
    const bool in_message = c->as_is && c->message;
    if (!in_message) {
      out.buffer = t.buffer(pool);
      if (!out.buffer) break;
    }
    const std::span<const std::byte> raw = source_->bytes(*c, node);
    {
      ScopedTimer busy(st.busy_ns);
      wire::Header& h = out.header;
      h.type = wire::FrameType::data;
      h.stream_id = cfg_.stream_id;
      h.sequence = c->seq;
      // connection is stamped, and the header encoded, by the sending thread.
      h.connections = static_cast<std::uint16_t>(cfg_.connections);
      h.checksum = wire::checksum(raw);
      std::size_t payload;
      if (c->as_is) {
        // Sent as it came (stored compressed, or a detector's message), never decoded here; the
        // checksum covers these bytes.
        h.codec = c->stored;
        h.payload_checksum = true;
        h.raw_size = static_cast<std::uint32_t>(c->raw_size);
        if (in_message) {
          out.body = std::move(c->message);
        } else {
          std::memcpy(out.payload_room().data(), raw.data(), raw.size());
        }
        payload = raw.size();
      } else {
        h.raw_size = static_cast<std::uint32_t>(raw.size());
        auto res = comp.compress(raw, out.payload_room());
        h.codec = res.codec;
        payload = res.size;
      }
      h.element_size = h.codec == Codec::bslz4 ? static_cast<std::uint8_t>(element_size_) : 0;
      h.payload_size = static_cast<std::uint32_t>(payload);
    }
    const std::size_t wire_size = wire::kHeaderSize + out.header.payload_size;
    st.chunks++;
    st.bytes_in += c->as_is ? c->raw_size : raw.size();
    st.bytes_out += wire_size;
    c.reset();  // the raw buffer goes back to its pool
    t.observe();
    bool pushed;
    {
      ScopedTimer wait(st.blocked_output_ns);
      pushed = wire_q_->push(out.header.sequence, out);
    }
    if (!pushed) break;
  }
}

void Sender::send_loop(StageThread& t) {
  const int index = t.index;
  StageStats& st = t.stats;
  LinkOptions opts = link_options(cfg_, endpoint_.for_connection(index),
                                  "connection " + std::to_string(index), cfg_.window, curve_);
  opts.connection = static_cast<std::uint16_t>(index);
  opts.connections = static_cast<std::uint16_t>(cfg_.connections);
  if (spill_) {
    // A source that cannot wait, and a spill for exactly that: a gateway that is down (not up
    // yet, restarting, its node rebooting) is waited for however long, the chunks going to the
    // spill meanwhile; the spill's limit is what ends it, each chunk it refuses declared lost.
    opts.connect_timeout_s = opts.reconnect_timeout_s = opts.ack_timeout_s =
        std::numeric_limits<double>::infinity();
  }
  AckedLink link(*ctx_, opts, ledger_, [this] { return rt_.aborted(); });
  link.set_gaps(gap_book_);
  // What the gateway settled without keeping it: declared gone to every later gateway (and kept
  // in the state record), so a loss survives the gateway pod however it ends.
  link.on_discarded([this](std::uint32_t stream, std::span<const std::uint64_t> seqs) {
    std::vector<wire::Gap> gaps;
    for (auto s : seqs) gaps.push_back({s, s + 1, wire::GapReason::gateway_discarded});
    if (!gap_book_->add(stream, gaps)) {
      throw std::runtime_error("more than " + std::to_string(wire::kMaxGapRecords) +
                               " separate gaps in stream " + std::to_string(stream));
    }
    if (discarded_++ == 0) {
      log_warn("the gateway discarded chunk " + std::to_string(seqs.front()) +
               " (corrupt on arrival, or past its sink): declared gone to every later gateway");
    }
  });
  std::uint64_t gaps_seen = gap_book_->version();
  struct Count {  // the link's counters into the sender's, however the thread ends
    AckedLink& l;
    Sender& s;
    ~Count() {
      s.retransmitted_ += l.retransmitted();
      s.two_part_ += l.written_in_two_parts();
      s.made_whole_ += l.made_whole();
      s.reconnects_ += l.reconnects() > 0 ? l.reconnects() : 0;
    }
  } count{link, *this};
  link.connect();
  link.set_metadata(cfg_.stream_id, metadata_);
  link.announce(cfg_.stream_id);
  link.wait_welcome(cfg_.connect_timeout_s);  // connected: a receiver answers at once
  {
    std::lock_guard lock(welcome_mu_);
    welcomed_ = true;
  }
  welcome_cv_.notify_all();
  std::uint64_t on_connection = 0;
  while (true) {
    {
      ScopedTimer wait(st.blocked_output_ns);
      link.wait_for_credit();
    }
    // While nothing is ready to send, the receiver's acknowledgements are still read: the
    // acknowledged count, the state record and the window stay current when a source pauses.
    std::optional<Chunk> c;
    bool done = false;
    while (!c && !done) {
      {
        ScopedTimer wait(st.blocked_input_ns);
        c = next_to_send(std::chrono::milliseconds(50), done);
      }
      if (!c && !done) link.serve(0);
    }
    if (!c) break;
    // Which connection carries the frame; the header is encoded once, here, on its way out.
    c->header.connection = static_cast<std::uint16_t>(index);
    const std::size_t size = wire::kHeaderSize + c->header.payload_size;
    if (gap_book_->version() != gaps_seen) {
      gaps_seen = gap_book_->version();
      link.serve(0);  // a gap declared meanwhile goes out before the chunks after it
    }
    {
      ScopedTimer wait(st.blocked_output_ns);
      if (c->body) {
        // Header and payload as two parts of one message (copied into one frame for a receiver
        // that does not take them so).
        link.send(c->header.stream_id, c->header.sequence, c->head(), c->take_payload());
      } else {
        link.send(c->header.stream_id, c->header.sequence, c->whole());
      }
    }
    ++on_connection;
    st.chunks++;
    st.bytes_out += size;
    wire_bytes_ += size;
    auto now_ns = (Clock::now() - rt_.started).count();
    std::int64_t expected = -1;
    first_chunk_ns_.compare_exchange_strong(expected, now_ns);
    last_send_ns_ = std::max<std::int64_t>(last_send_ns_.load(), now_ns);
    ++sent_chunks_;
    t.observe();
  }
  if (rt_.aborted()) return;
  if (drain_pauses()) {
    // Paused, not ended: everything sent is acknowledged, the stream stays open, and a
    // restarted sender resumes it after what the receiver has.
    ScopedTimer wait(st.blocked_output_ns);
    link.finish();
    return;
  }
  // End of stream on this connection: the stream's totals and this connection's count.
  NS_ASSERT(source_done_.load());
  std::byte frame[wire::kHeaderSize + wire::kEndOfStreamPayload];
  wire::Header h;
  h.type = wire::FrameType::end_of_stream;
  h.stream_id = cfg_.stream_id;
  h.connection = static_cast<std::uint16_t>(index);
  h.connections = static_cast<std::uint16_t>(cfg_.connections);
  h.sequence = produced_chunks_.load();
  h.payload_size = wire::kEndOfStreamPayload;
  wire::encode_header(h, frame);
  wire::encode_end_of_stream({produced_chunks_.load(), produced_bytes_.load(), on_connection},
                             frame + wire::kHeaderSize);
  link.send_end(cfg_.stream_id, zmq::Message::of({frame, sizeof(frame)}));
  ScopedTimer wait(st.blocked_output_ns);
  link.finish();
}

// Moves spilled frames, oldest first, to the sending threads' queue: while it has room, or (wait)
// all of them, waiting for room. False once the run is closing.
bool Sender::unspill(BufferPool& pool, bool wait) {
  while (!spill_->empty()) {
    if (!wait && send_q_->depth() >= send_q_->capacity()) return true;
    Chunk c;
    c.buffer = pool.take();
    if (!c.buffer) return false;
    const std::size_t n = spill_->read({c.buffer->data, c.buffer->capacity});
    c.buffer->size = n;
    if (wire::decode({c.buffer->data, n}, cfg_.chunk_bytes, c.header) != wire::DecodeError::ok) {
      throw std::runtime_error("spill: a frame read back from " + spill_->dir() + " is damaged");
    }
    spill_disk_bytes_ = spill_->disk_bytes();
    spill_frames_ = spill_->frames();
    // An earlier sender's: it may have been sent and acknowledged before that sender stopped.
    if (ledger_->contains(cfg_.stream_id, c.header.sequence)) continue;
    c.header.connections = static_cast<std::uint16_t>(cfg_.connections);
    if (!send_q_->push(c)) return false;
  }
  return true;
}

// The chunks in order from the compressors to the sending threads. While the sending threads
// keep up, a chunk goes straight on; once their queue is full (the network, the receiver or its
// sink is behind), chunks go to the spill store instead, and every later chunk after them, until
// the store has drained into the queue again: the order on the wire never changes, and memory
// holds no more than the pools. A full store holds a source that can wait back; for any other,
// the chunk is lost, counted, and reported (the receiver reports the gap too).
void Sender::spill_loop() {
  BufferPool& pool = wire_pools_->for_node(rt_.placement.stage(Stage::send).front().numa_node);
  const bool can_wait = source_can_wait();
  if (!wait_welcome()) return;  // the receiver's answer says which recovered chunks it has
  while (true) {
    if (!unspill(pool, false)) return;
    bool done = false;
    std::optional<Chunk> c =
        wire_q_->pop_for(std::chrono::milliseconds(spill_->empty() ? 50 : 5), done);
    if (!c) {
      if (done) break;
      continue;
    }
    if (spill_->empty() && send_q_->try_push(*c)) continue;
    const std::size_t frame_size = wire::kHeaderSize + c->header.payload_size;
    bool appended;
    if (c->body) {
      std::byte head[wire::kHeaderSize];
      wire::encode_header(c->header, head);
      appended = spill_->append({head, sizeof(head)}, c->payload());
    } else {
      c->seal();
      appended = spill_->append({c->buffer->data, c->buffer->size});
    }
    if (appended) {
      if (spilled_chunks_++ == 0)
        log_warn("spill: the sending threads fell behind; spilling to " + spill_->dir());
      spilled_bytes_ += frame_size;
      spill_disk_bytes_ = spill_->disk_bytes();
      spill_frames_ = spill_->frames();
      spill_peak_bytes_ = std::max(spill_peak_bytes_.load(), spill_->disk_bytes());
      continue;
    }
    if (can_wait) {
      // Full: the source waits while the spill drains, then this chunk follows it.
      if (!unspill(pool, true) || !send_q_->push(*c)) return;
      continue;
    }
    // Declared: the receiver counts it missing and names it, and does not wait for it.
    const wire::Gap gap{c->header.sequence, c->header.sequence + 1, wire::GapReason::spill_full};
    if (!gap_book_->add(cfg_.stream_id, {&gap, 1})) {
      throw std::runtime_error("spill: more than " + std::to_string(wire::kMaxGapRecords) +
                               " separate runs of chunks refused by the full spill");
    }
    ledger_->settle(cfg_.stream_id, {&gap, 1});
    if (spill_->disk_full()) ++spill_disk_full_;
    if (spill_lost_++ == 0 || (spill_->disk_full() && spill_disk_full_ == 1)) {
      log_line("spill: " +
               (spill_->disk_full()
                    ? "no space left on the device of " + spill_->dir() + " (" +
                          std::to_string(spill_->disk_bytes()) + " bytes spilled, max_bytes " +
                          std::to_string(spill_->max_bytes()) + ")"
                    : "full (" + std::to_string(spill_->disk_bytes()) + " of " +
                          std::to_string(spill_->max_bytes()) + " bytes in " + spill_->dir() +
                          ")") +
               ": chunk " + std::to_string(c->header.sequence) +
               " lost, and every chunk the spill refuses from now on is counted lost");
    }
  }
  // The compressors are done: what is spilled follows, in order.
  if (!unspill(pool, true)) return;
  send_q_->close();
}

void Sender::declare_metrics() {
  MetricRegistry& m = rt_.metrics();
  m.counter("numastream_raw_bytes_total", "Raw (uncompressed) bytes taken from the source.",
            [this] { return static_cast<double>(rt_.stats(Stage::compress).bytes_in.load()); });
  m.counter("numastream_wire_bytes_total", "Bytes of the frames handed to the network.",
            [this] { return static_cast<double>(wire_bytes_.load()); });
  m.counter("numastream_chunks_sent_total", "Frames handed to ZeroMQ (first transmissions).",
            [this] { return static_cast<double>(sent_chunks_.load()); });
  m.gauge("numastream_chunks_acknowledged", "Chunks of the stream the receiver has taken.",
          [this] { return static_cast<double>(ledger_->acknowledged(cfg_.stream_id)); });
  m.add("numastream_queue_depth", MetricType::gauge, "Items in a stage queue.",
        [this](MetricSamples& s) {
          s.add({{"queue", "raw"}}, static_cast<double>(raw_q_->depth()));
          s.add({{"queue", "wire"}}, static_cast<double>(wire_q_->depth()));
        });
  wire_pools_->declare_metrics(m);
  m.gauge("numastream_compression_ratio", "Raw bytes over compressed bytes so far.", [this] {
    const double raw = static_cast<double>(rt_.stats(Stage::compress).bytes_in.load());
    const double wire = static_cast<double>(rt_.stats(Stage::compress).bytes_out.load());
    return wire > 0 ? raw / wire : 0;
  });
  if (spill_) {
    m.gauge("numastream_spill_bytes", "Bytes in the spill files now.",
            [this] { return static_cast<double>(spill_disk_bytes_.load()); });
    m.gauge("numastream_spill_max_bytes", "The spill's limit (spill.max_bytes).",
            [this] { return static_cast<double>(cfg_.spill.max_bytes); });
    m.gauge("numastream_spill_chunks", "Chunks waiting in the spill.",
            [this] { return static_cast<double>(spill_frames_.load()); });
    m.counter("numastream_spilled_chunks_total", "Chunks that went through the spill.",
              [this] { return static_cast<double>(spilled_chunks_.load()); });
    m.counter("numastream_spill_lost_chunks_total", "Chunks lost because the spill was full.",
              [this] { return static_cast<double>(spill_lost_.load()); });
  }
  source_->declare_metrics(m);
}

void Sender::save_state() {
  auto [floor, above] = ledger_->snapshot(cfg_.stream_id);
  state_->save(floor, above, gap_book_->of(cfg_.stream_id));
}

RunResult Sender::run(const RunHooks& hooks) {
  load_state();
  curve_ = load_curve(cfg_.security);
  if (curve_) {
    log_line(std::string(curve_->authenticate_only ? "authenticating (frames not encrypted)"
                                                   : "CURVE: encrypting") +
             " as " + curve_->public_key + " (public key)");
  }
  ctx_ =
      std::make_unique<zmq::Context>(rt_.threads(Stage::io), rt_.placement.stage_cpus(Stage::io));
  prepare_source();
  if (state_ && !source_->replays()) {
    taken_ = std::make_unique<TakenRecord>(cfg_.state_dir, cfg_.stream_id);
    if (auto e = taken_->earlier()) {
      log_line("state " + taken_->path() + ": earlier senders took " +
               (e->exact ? std::to_string(e->taken) : "at most " + std::to_string(e->at_most)) +
               " chunks from the live source");
    }
  }
  const int compressors = rt_.threads(Stage::compress);
  const int senders = rt_.threads(Stage::send);
  build(compressors, senders);
  declare_metrics();
  std::unique_ptr<MetricsServer> server;
  if (!cfg_.metrics_listen.empty()) {
    server = std::make_unique<MetricsServer>(
        cfg_.metrics_listen, [this] { return rt_.metrics().text(); },
        [this] { return !rt_.aborted(); });
    log_line("metrics on port " + std::to_string(server->port()));
    if (hooks.on_metrics_port) hooks.on_metrics_port(server->port());
  }
  rt_.started = Clock::now();
  StageGraph graph(rt_);
  declare_graph(graph, compressors, senders);
  std::jthread recorder = start_recorder();
  graph.run();
  if (controller_) controller_->stop();
  if (extra_) extra_->join();
  // Every frame was acknowledged (or the run failed): nothing queued is worth waiting for.
  ctx_.reset();
  if (state_) {
    recorder.request_stop();
    recorder.join();
    try {
      save_state();  // the final record, before the lock goes with this process
    } catch (const std::exception& e) {
      rt_.fail(e.what());
    }
  }

  RunResult result;
  result.summary = summary();
  if (controller_) controller_->report(result.summary);
  if (spill_) {
    result.summary["spill"] = {{"path", cfg_.spill.path},
                               {"max_bytes", cfg_.spill.max_bytes},
                               {"spilled_chunks", spilled_chunks_.load()},
                               {"spilled_bytes", spilled_bytes_.load()},
                               {"peak_bytes", spill_peak_bytes_.load()},
                               {"left_chunks", spill_->frames()},
                               {"recovered_chunks", spill_->recovered().frames},
                               {"lost", spill_lost_.load()},
                               {"lost_disk_full", spill_disk_full_}};
    if (spill_lost_ > 0) {
      log_error(
          "spill: " + std::to_string(spill_lost_.load()) + " chunks lost: the spill (" +
          std::to_string(cfg_.spill.max_bytes) + " bytes) was full and the source cannot wait" +
          (spill_disk_full_ > 0 ? " (" + std::to_string(spill_disk_full_) +
                                      " for want of space on the device of " + cfg_.spill.path + ")"
                                : std::string()));
    }
  }
  source_->report(result.summary);
  if (rt_.aborted()) {
    result.exit_code = kExitFailure;
  } else if (drain_pauses()) {
    result.exit_code = kExitInterruptedBase + drain_signal();
  }
  return result;
}
// Waits for a previous sender of this stream still writing its final record (a replaced pod that
// is draining), then starts from what it recorded: acknowledged chunks and declared gaps.
void Sender::load_state() {
  if (!cfg_.state_dir.empty()) {
    state_ =
        std::make_unique<StreamState>(cfg_.state_dir, cfg_.stream_id, cfg_.reconnect_timeout_s);
    if (auto rec = state_->load()) {
      ledger_->merge(cfg_.stream_id, rec->first, rec->second);
      state_floor_ = rec->first;
      // Gaps earlier senders declared go to the receiver again: one that restarted learns them.
      const auto gaps = state_->gaps();
      if (!gaps.empty()) {
        gap_book_->add(cfg_.stream_id, gaps);
        ledger_->settle(cfg_.stream_id, gaps);
      }
      log_line("state " + state_->path() + ": an earlier sender recorded " +
               std::to_string(ledger_->acknowledged(cfg_.stream_id)) + " acknowledged chunks");
    }
  }
}

// The pools and queues of one run, the spill, the governor, and what an abort closes.
void Sender::build(int compressors, int senders) {
  const SenderPools pools = plan_sender_pools(cfg_, senders);
  spares_ = pools.spares;
  wire_capacity_ = pools.wire_capacity;
  wire_pools_ = std::make_unique<NodePools>(rt_, Stage::compress, "wire", pools.wire_buffers, 1,
                                            wire_capacity_);
  raw_q_ = std::make_unique<BoundedQueue<RawChunk>>(static_cast<std::size_t>(cfg_.queue_depth));
  // In sequence order onto the wire, so the receiver's reordering stays within what is in flight.
  wire_q_ = std::make_unique<OrderedQueue<Chunk>>(static_cast<std::size_t>(cfg_.queue_depth));
  open_spill();
  if (spares_ > 0) {
    adaptive::Limits limits;
    limits.min_active = 1;
    limits.max_active = compressors + spares_;
    governor_ = std::make_unique<adaptive::Governor>(limits, compressors);
  }
  rt_.on_abort([this] {
    if (governor_) governor_->close();
    raw_q_->close();
    wire_q_->close();
    if (send_q_) send_q_->close();
    wire_pools_->close_all();
    source_->close();
  });
}

// The spill (cfg.spill): what a live source's earlier sender left in it goes first.
void Sender::open_spill() {
  if (!cfg_.spill.enabled()) return;
  // A live source's earlier sender may have left chunks in the spill it never sent: they go
  // first, in order, under their own sequence numbers. A replaying source sends them again
  // from the source instead.
  SpillStore::Recover recover;
  if (!source_->replays()) {
    recover = [this](std::span<const std::byte> head, std::size_t size) {
      wire::Header h;
      if (wire::decode_data_header(head, size, cfg_.chunk_bytes, h) != wire::DecodeError::ok ||
          h.stream_id != cfg_.stream_id ||
          (!recovered_seqs_.empty() && h.sequence <= recovered_seqs_.back())) {
        return false;
      }
      recovered_seqs_.push_back(h.sequence);
      return true;
    };
  }
  spill_ =
      std::make_unique<SpillStore>(cfg_.spill.path, cfg_.stream_id, cfg_.spill.max_bytes, recover);
  if (const auto& r = spill_->recovered(); r.frames > 0 || !r.why_dropped.empty()) {
    log_line("spill: " + std::to_string(r.frames) + " chunks (" + std::to_string(r.bytes) +
             " bytes) an earlier sender "
             "spilled are sent first" +
             (r.frames > 0 ? ", chunks " + std::to_string(recovered_seqs_.front()) + ".." +
                                 std::to_string(recovered_seqs_.back())
                           : std::string()) +
             (r.why_dropped.empty()
                  ? std::string()
                  : "; " + std::to_string(r.dropped_bytes) + " bytes after " + r.why_dropped +
                        " are dropped (their chunks are declared missing)"));
  }
  send_q_ = std::make_unique<BoundedQueue<Chunk>>(static_cast<std::size_t>(cfg_.queue_depth));
  log_line("spill: up to " + std::to_string(cfg_.spill.max_bytes) + " bytes in " + cfg_.spill.path +
           (source_can_wait()
                ? " (the source waits when it is full)"
                : " (the source cannot wait: what a full spill refuses is lost and counted)"));
}

// The graph: source -> raw_q_ -> compress (+ spares on the sending threads' CPUs) -> wire_q_
// [-> spill -> send_q_] -> send; with spares, the adaptive runtime that sets them to work.
void Sender::declare_graph(StageGraph& graph, int compressors, int senders) {
  graph.add({.stage = Stage::send,
             .threads = senders,
             .what = [](int i) { return "connection " + std::to_string(i) + ": "; },
             .body = [this](StageThread& t) { send_loop(t); }});
  StageGraph::Stage_& compress = graph.add({.stage = Stage::compress,
                                            .threads = compressors,
                                            .what = [](int) { return std::string("compress: "); },
                                            .body = [this](StageThread& t) { compress_loop(t); },
                                            .spares = spares_,
                                            .host = Stage::send,
                                            .done = [this] { wire_q_->close(); }});
  if (spill_) {
    // On the source's CPU: a paced source sleeps most of the time, and this thread mostly waits.
    graph.add({.stage = Stage::source,
               .threads = 0,
               .what = [](int) { return std::string("spill: "); },
               .body = [this](StageThread&) { spill_loop(); },
               .spares = 1,
               .host = Stage::source,
               .spare_index = 1});
  }
  graph.add({.stage = Stage::source,
             .threads = 1,
             .what = [](int) { return std::string("source: "); },
             .body = [this](StageThread& t) { source_loop(t); },
             .after_each = [this] { source_->end(); },
             .done =
                 [this] {
                   source_done_ = true;
                   raw_q_->close();
                   if (governor_)
                     governor_->close();  // parked compressors leave; active ones drain the queue
                 }});
  if (governor_) {
    extra_ = std::make_unique<adaptive::ExtraWorkers>(
        rt_, adaptive::ExtraWorkers::Stage_{
                 Stage::compress, [this](StageThread& t) { compress_loop(t); },
                 [this, &compress](int n) { return !raw_q_->closed() && compress.admit(n); },
                 [&compress] { compress.ended(); }});
    controller_ = std::make_unique<adaptive::Controller>(
        rt_, Stage::compress, Stage::send, *governor_,
        [this](int n, int first, const std::vector<int>& cpus) {
          return extra_->start(n, first, cpus);
        });
    controller_->declare_metrics(rt_.metrics());
  }
}

// Records what the receiver acknowledged every half second while the stream runs (with a state
// directory); none without one.
std::jthread Sender::start_recorder() {
  if (!state_) return {};
  return std::jthread([this](const std::stop_token& st) {
    std::uint64_t saved = ledger_->acknowledged(cfg_.stream_id);
    while (!st.stop_requested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::uint64_t now = ledger_->acknowledged(cfg_.stream_id);
      if (now == saved) continue;
      try {
        save_state();
        saved = now;
      } catch (const std::exception& e) {
        rt_.fail(e.what());
        return;
      }
    }
  });
}

// The run's summary (the last line on stdout).
nlohmann::json Sender::summary() {
  const double secs =
      std::max(1e-9, static_cast<double>(last_send_ns_.load() -
                                         std::max<std::int64_t>(0, first_chunk_ns_.load())) /
                         1e9);
  const double raw = static_cast<double>(rt_.stats(Stage::compress).bytes_in.load());
  const double wire = static_cast<double>(wire_bytes_.load());
  return {{"role", "send"},
          {"stream_id", cfg_.stream_id},
          {"endpoint", cfg_.endpoint},
          {"connections", cfg_.connections},
          {"codec", codec_name(cfg_.codec)},
          {"curve", curve_.has_value()},
          {"chunks", sent_chunks_.load()},
          // Settled = acknowledged or declared missing; the declared ones are not acknowledged.
          {"acknowledged",
           ledger_->acknowledged(cfg_.stream_id) -
               std::min(ledger_->acknowledged(cfg_.stream_id), gap_book_->chunks(cfg_.stream_id))},
          {"declared_missing", gap_book_->chunks(cfg_.stream_id)},
          {"declared_missing_from_earlier_senders", declared_at_start_},
          {"skipped_acknowledged", skipped_chunks_},
          {"state_floor", state_floor_},
          {"retransmitted", retransmitted_.load()},
          {"frames_in_two_parts", two_part_.load()},
          {"frames_made_whole", made_whole_.load()},
          {"reconnects", reconnects_.load()},
          {"raw_bytes", rt_.stats(Stage::compress).bytes_in.load()},
          {"wire_bytes", wire_bytes_.load()},
          {"ratio", wire > 0 ? raw / wire : 0},
          {"lost", spill_ ? nlohmann::json(spill_lost_.load()) : nlohmann::json(nullptr)},
          {"corrupt", nullptr},
          {"duplicates", nullptr},
          {"seconds", secs},
          {"raw_gbps", raw * 8 / secs / 1e9},
          {"wire_gbps", wire * 8 / secs / 1e9},
          {"max_rss_kb", max_rss_kb()},
          {"placement", rt_.placement_json()},
          {"stages", rt_.stages_json()},
          {"drained", rt_.drain_requested()},
          {"paused", drain_pauses() && !rt_.aborted()},
          {"error", rt_.aborted() ? nlohmann::json(rt_.error()) : nlohmann::json(nullptr)}};
}

}  // namespace

RunResult run_sender(const Config& cfg, std::stop_token stop, const RunHooks& hooks) {
  Sender s(cfg, std::move(stop));
  return s.run(hooks);
}

}  // namespace numastream
