// The sender's source stage: the chunks it reads, a live source's numbering after an earlier
// sender, and a drain (sender.hpp).
#include "pipeline/sender.hpp"

namespace numastream {
namespace {

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

}  // namespace

bool Sender::wait_welcome() {
  return welcome_.wait([this] { return rt_.aborted(); });
}

void Sender::prepare_source() {
  SourceSetup setup{
      cfg_, rt_.stage_nodes(Stage::compress), rt_.placement.stage(Stage::source).front().numa_node,
      static_cast<std::size_t>(cfg_.queue_depth + rt_.threads(Stage::compress) + 1), log_line};
  source_ = make_source(setup, *ctx_);
  const hdf5::FrameShape shape = source_->shape();
  stream_.element_size = dtype_size(shape.dtype);
  nlohmann::json meta{{"dtype", shape.dtype}, {"shape", shape.dims}};
  // A raw zmq source: frames it queued for a sender that died are counted by no one (the
  // gateway says its losses are a lower bound then).
  if (cfg_.source.kind == SourceConfig::Kind::zmq) meta["source"] = "zmq";
  stream_.metadata = meta.dump();
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
    counts_.produced_chunks = seq;
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
    if (source_->replays() && ledger_->contains(stream, seq)) {
      if (!skip_acknowledged(seq)) break;
      ++seq;
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
      end_.source_ended = !stop();
      break;
    }
    // Counted taken before it enters the pipeline: if this sender dies, the next one knows.
    if (records_.taken) records_.taken->taken(seq + 1);
    const std::size_t size = c.message  ? c.message->bytes().size()
                             : c.buffer ? c.buffer->size
                                        : cfg_.chunk_bytes;
    const std::size_t raw = c.as_is ? c.raw_size : size;
    if (!hand_on(c, t)) break;
    ++seq;
    st.chunks++;
    st.bytes_out += size;
    counts_.produced_bytes += raw;
    counts_.produced_chunks = seq;
    t.observe();
  }
  if (drain_from) log_drain(*drain_from, seq);
}

// Hands chunk `c` to the next stage: to the compressing threads, or, a detector's message sent
// as it came (nothing to compress, only a checksum of bytes this thread just received), framed
// here and straight to the sending threads: a hand-off between threads costs more than the
// checksum at a fast detector's message sizes. So is a small chunk sent uncompressed (codec
// none: a copy and a checksum), framed here too. When the compressing threads' queue is full, a
// source on a CPU of its own compresses the chunk itself (compress_here). False once the pipeline
// is shutting down.
bool Sender::hand_on(RawChunk& c, StageThread& t) {
  StageStats& st = t.stats;
  if (!(c.as_is && c.message)) {
    if (cfg_.codec == Codec::none && !c.as_is &&
        source_->bytes(c, t.numa_node).size() <= kFramedHere)
      return compress_here(c, t);
    if (t.helps()) {
      if (raw_q_->try_push(c)) return true;
      return !raw_q_->closed() && compress_here(c, t);
    }
    ScopedTimer wait(st.blocked_output_ns);
    return raw_q_->push(c);
  }
  // The compressing stage's work, done here, counted as that stage's (its metrics and summary:
  // raw and wire bytes, chunks, busy time).
  StageStats& framing = rt_.stats(Stage::compress);
  Chunk out;
  {
    ScopedTimer busy(framing.busy_ns);
    out.header = data_header(c, c.message->bytes());
    out.body = std::move(c.message);
  }
  framing.chunks++;
  framing.bytes_in += c.raw_size;
  framing.bytes_out += wire::kHeaderSize + out.header.payload_size;
  ScopedTimer wait(st.blocked_output_ns);
  return wire_q_->push(out.header.sequence, out);
}

// BLQ's help for a consumer: every compressing thread is busy and their queue is full, so the
// source compresses this chunk itself rather than sleep until one takes the next: its CPU, one
// of its own (StageThread::helps), would idle meanwhile. On a CPU shared with the compressing
// threads it would only take theirs (docs/performance.md). The chunk is the compressing stage's in
// the metrics and the summary (chunks, bytes); the time is the source's (busy), so the adaptive
// runtime still reads the compressing threads' own load. The wire pools hold one buffer for it.
bool Sender::compress_here(RawChunk& c, StageThread& t) {
  if (!helper_) helper_ = std::make_unique<Helper>(cfg_, stream_.element_size);
  Chunk out;
  out.buffer = t.buffer(wire_pools_->for_node(t.numa_node));
  if (!out.buffer) return false;
  {
    ScopedTimer busy(t.stats.busy_ns);
    compress_into(c, out, helper_->comp, helper_->sum, t.numa_node);
  }
  ++counts_.compressed_by_source;
  c = RawChunk{};  // a raw buffer goes back to its pool
  ScopedTimer wait(t.stats.blocked_output_ns);
  return wire_q_->push(out.header.sequence, out);
}

void Sender::log_drain(Clock::time_point from, std::uint64_t seq) const {
  const double secs = std::chrono::duration<double>(Clock::now() - from).count();
  log_line("drain: " + std::to_string(seq - end_.drain_seq) + " chunks read from the detector in " +
           seconds(secs) + " s after the stop was asked; " +
           (end_.source_ended ? std::string("the detector ended the stream")
            : end_.drain_cut
                ? "the detector did not pause within source.drain_s (" +
                      seconds(cfg_.source.drain_s) +
                      " s): what it had in transit is lost (a stream2 gateway names the image ids)"
                : "the detector paused: nothing was in transit"));
}

// A replayed chunk the receiver already has (this sender restarted): skipped, its bytes still
// counted in the stream's totals. False at the source's end.
bool Sender::skip_acknowledged(std::uint64_t seq) {
  const std::size_t size = source_->skip(seq);
  if (size == 0) return false;
  wire_q_->skip(seq);
  ++counts_.skipped_chunks;
  counts_.produced_bytes += size;
  counts_.produced_chunks = seq + 1;
  return true;
}

// A live source during a drain: done once the source has waited source.drain_quiet_ms for a
// message with none coming (the detector paused: nothing is in transit), or source.drain_s after
// the drain began.
bool Sender::drain_done(std::optional<Clock::time_point>& from) {
  const auto now = Clock::now();
  if (!from) {
    from = now;
    end_.drain_seq = counts_.produced_chunks.load();
    log_line("drain: reading the detector until it pauses (" +
             std::to_string(cfg_.source.drain_quiet_ms) + " ms without a message) or " +
             seconds(cfg_.source.drain_s) + " s pass");
  }
  if (now - std::max(source_->waiting_since(), *from) >=
      std::chrono::milliseconds(cfg_.source.drain_quiet_ms))
    return true;
  if (now - *from >= std::chrono::duration<double>(cfg_.source.drain_s)) {
    end_.drain_cut = true;
    return true;
  }
  return false;
}

// A live source cannot replay. Its sender numbers on after every chunk an earlier sender of the
// stream took (its taken record) or the receiver has, and declares what earlier senders took and
// never had acknowledged as a gap: the receiver counts those chunks missing and names them.
std::uint64_t Sender::start_live() {
  const std::uint32_t stream = cfg_.stream_id;
  auto [floor, above] = ledger_->snapshot(stream);
  std::uint64_t start = ledger_->end(stream);
  const auto earlier = records_.taken ? records_.taken->earlier() : std::nullopt;
  if (earlier) start = std::max(start, earlier->at_most);
  if (!records_.recovered.empty()) start = std::max(start, records_.recovered.back() + 1);
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
  gaps = without(gaps, records_.recovered);  // those come from the spill
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
      throw std::runtime_error("more than " + std::to_string(wire::kMaxDeclaredGaps) +
                               " separate gaps in stream " + std::to_string(stream));
    ledger_->settle(stream, gaps);
  }
  records_.declared_at_start = missing;
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

}  // namespace numastream
