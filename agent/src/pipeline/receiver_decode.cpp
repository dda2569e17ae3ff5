// A gateway's decompressing threads: each takes a frame the receiving threads queued, verifies it
// (checksum, framing, decoding), and hands the chunk to the consumers in the forms they take, or
// settles it here when none takes it.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/receiver.hpp"

namespace numastream {

namespace {
// Hands the frame's payload to `out` in the message it arrived in.
void pass_on(Inbound& in, Chunk& out) {
  if (in.body) {
    out.body = std::move(in.body);
    out.body_offset = 0;
  } else {
    out.body = std::move(in.msg);
    out.body_offset = wire::kHeaderSize;
  }
}

// How a chunk is checked and where its payload goes: kept compressed as it came (decoded into
// scratch to check it, unless its checksum covers the compressed bytes and verify is not
// `decode`), as it is (not compressed), or decoded into `out`'s buffer.
enum class Checked { kept, as_is, decoded };

// Verifies a chunk (checksum, bslz4 framing, decoding) and, when it is good, hands its payload to
// `out` (or, decoded, the payload as it came to `as_came`). False: corrupt.
bool verify(Inbound& in, Checked how, Config::Verify mode, Decompressor& dec,
            wire::ChecksumStream& sum, std::vector<std::byte>& scratch, Chunk& out,
            std::optional<Chunk>& as_came) {
  const wire::Header& h = in.header;
  const auto payload = in.payload();
  bool ok = true;
  if (h.payload_checksum) {
    // Arrived compressed: the checksum covers the bytes as sent, the framing its sizes.
    ok = wire::checksum(payload) == h.checksum &&
         (h.codec != Codec::bslz4 || bslz4::check_framing(payload, h.element_size, h.raw_size)) &&
         (h.codec != Codec::none || payload.size() == h.raw_size);
  }
  switch (how) {
    case Checked::kept:
      if (ok && (!h.payload_checksum || mode == Config::Verify::decode)) {
        scratch.resize(h.raw_size);
        sum.reset();
        ok = dec.decompress(h.codec, payload, scratch, h.element_size, &sum) &&
             (h.payload_checksum || sum.digest() == h.checksum);
      }
      if (ok) pass_on(in, out);
      break;
    case Checked::as_is:
      // Not compressed: the payload is the raw bytes, checked where they are.
      ok = ok && (h.payload_checksum || wire::checksum(payload) == h.checksum);
      if (ok) pass_on(in, out);
      break;
    case Checked::decoded: {
      std::span<std::byte> raw = out.payload_room().first(h.raw_size);
      // The raw bytes' checksum is taken as they are decoded, each block still in the cache.
      sum.reset();
      ok = ok && dec.decompress(h.codec, payload, raw, h.element_size, &sum) &&
           (h.payload_checksum || sum.digest() == h.checksum);
      if (ok && as_came) pass_on(in, *as_came);
      break;
    }
  }
  return ok;
}
}  // namespace

namespace {

// Re-framed for the consumers: a raw chunk (the zmq sink forwards it as is), or the frame as it
// came (`keep`: the bslz4 frame the HDF5 sink stores); each a stream of one connection. A sink
// encodes the header if it sends the frame on. `decoded_sum`: the raw bytes' checksum, taken as
// they were decoded (a chunk that was).
void reframe(Chunk& out, std::optional<Chunk>& as_came, bool keep, std::uint64_t decoded_sum) {
  wire::Header& h = out.header;
  if (!keep) {
    // A checksum over a compressed payload is over the raw bytes once decoded; over one that
    // was not compressed it is over the raw bytes already (and was checked).
    const bool recompute = h.payload_checksum && h.codec != Codec::none;
    h.codec = Codec::none;
    h.element_size = 0;
    h.payload_size = h.raw_size;
    if (recompute) h.checksum = decoded_sum;  // what it decoded to (never kept, so decoded)
    h.payload_checksum = false;
  }
  h.connection = 0;
  h.connections = 1;
  if (out.buffer) out.buffer->size = wire::kHeaderSize + h.payload_size;
  if (as_came) as_came->header.connection = 0, as_came->header.connections = 1;
}

}  // namespace

// A gateway decodes what its receiving threads took: decompressing threads verify each chunk
// (checksum, framing, decoding) and hand it to the consumers in the forms they take (or settle it
// here when none takes it), with spare decompressing threads on the receiving threads' CPUs
// (placement.adaptive). It answers a stream's control frames itself: resume and end frames from
// the record of what its sinks took; metadata and gaps are kept by the receiver (meta_, the
// tracker), the gaps its senders declared handed to its onward hops.
class Receiver::Decoding final : public Receiver::Role {
 public:
  explicit Decoding(Receiver& r) : r_(r) {}
  const char* name() const override { return "receive"; }
  bool verifies() const override { return true; }

  void build(const ReceiverPools& pools) override {
    Runtime& rt = r_.rt_;
    raw_pools_ = std::make_unique<NodePools>(rt, Stage::decompress, "raw", pools.raw_buffers, 1,
                                             pools.raw_capacity);
    consumers_ = std::make_unique<ConsumerSet>(ConsumerWiring{
        .cfg = r_.cfg_,
        .tracker = r_.tracker_,
        .ledger = r_.acks_.ledger,
        .ctx = *r_.ctx_,
        .reorder_window = r_.reorder_window_,
        .slack = pools.slack,
        .onward_window = r_.onward_window(),
        .ack = [this](int via, std::uint32_t stream,
                      std::uint64_t seq) { r_.acknowledge(via, stream, seq); },
        .discard = [this](int via, std::uint32_t stream,
                          std::uint64_t seq) { r_.discard(via, stream, seq); },
        .aborted = [&rt] { return rt.aborted(); },
        .drain_requested = [&rt] { return rt.drain_requested(); },
        .metadata = [this](std::uint32_t stream) { return r_.meta_.of(stream); },
        .downstream_end =
            [this](std::uint32_t stream, std::uint64_t count, std::uint16_t connection,
                   std::uint16_t connections) {
              return r_.downstream_end(stream, count, connection, connections);
            },
    });
    if (r_.cfg_.preview.enabled) {
      preview_ = std::make_unique<Preview>(static_cast<std::size_t>(r_.cfg_.preview.max_side),
                                           std::chrono::milliseconds(r_.cfg_.preview.interval_ms));
    }
    spares_.plan(pools.spares, rt.threads(Stage::decompress));
    // No decoding room: take_inline takes only what is never decoded.
    for (int i = 0; i < rt.threads(Stage::receive); ++i)
      inline_work_.push_back(std::make_unique<Work>(0));
  }

  // consumers <- decompress (+ spares on the receiving threads' CPUs); with spares, the adaptive
  // runtime that sets them to work.
  void declare(StageGraph& graph, std::function<void()> joined) override {
    if (!consumers_->empty()) {
      graph.add({.stage = Stage::sink,
                 .threads = static_cast<int>(consumers_->size()),
                 .what = [this](int i) { return consumers_->what(i); },
                 .body = [this](StageThread& t) { consumers_->run(t.index, t.stats); }});
    }
    StageGraph::Stage_& decompress =
        graph.add({.stage = Stage::decompress,
                   .threads = r_.rt_.threads(Stage::decompress),
                   .what = [](int) { return std::string("decompress: "); },
                   .body = [this](StageThread& t) { decompress_loop(t); },
                   .spares = spares_.count(),
                   .host = Stage::receive,
                   .done =
                       [this] {
                         // A receiving thread still handing on a chunk it took finishes first.
                         for (int n; (n = inline_active_.load()) != 0;) inline_active_.wait(n);
                         consumers_->close();
                       },
                   .joined = std::move(joined)});
    spares_.start(r_.rt_, Stage::receive,
                  {Stage::decompress, [this](StageThread& t) { decompress_loop(t); },
                   [this, &decompress](int n) {
                     return !r_.stop_taking_ && !r_.wire_q_->closed() && decompress.admit(n);
                   },
                   [&decompress] { decompress.ended(); }});
  }

  void stopping() override {
    spares_.close();  // parked decompressors leave; active ones drain the queue
  }
  void close() override {
    spares_.close();
    consumers_->close();
    raw_pools_->close_all();
  }
  std::vector<std::string> finish() override {
    spares_.stop();
    return consumers_->finish([this](const std::string& why) { r_.rt_.fail(why); });
  }
  void declare_metrics(MetricRegistry& m) override {
    consumers_->declare_metrics(m);
    raw_pools_->declare_metrics(m);
  }
  std::optional<std::size_t> sink_depth() const override { return consumers_->depth_of_one(); }
  // The first consumer reports as the one sink always did; with several (or a spill), each also
  // in `consumers`.
  void report(nlohmann::json& summary) const override {
    consumers_->report(summary);
    spares_.report(summary);
    summary["onward_security"] = nullptr;  // a relay's onward link: none here
  }
  Preview* preview() override { return preview_.get(); }

  AckLedger& record() override { return r_.acks_.ledger; }
  bool resumed(Inbound& in, zmq::Socket& sock, const zmq::Message& peer,
               std::uint16_t connections) override {
    r_.answer(sock, peer,
              r_.welcome(in.header.stream_id, static_cast<std::uint16_t>(in.via), connections, 0));
    return true;
  }
  bool metadata(Inbound& /*in*/) override { return true; }
  bool gaps(Inbound& in, const std::vector<wire::Gap>& missing) override {
    consumers_->declare_onward(in.header.stream_id, missing);
    return true;
  }
  void ended(const wire::Header& h, int via, zmq::Socket& sock, const zmq::Message& peer,
             std::uint16_t connections) override {
    r_.end_of_stream(h.stream_id, via, sock, peer, connections);
  }
  bool owes_end(std::uint32_t stream) override { return consumers_->spills_owe(stream); }
  // A small chunk that needs neither decoding nor a buffer (not compressed, or kept as it came
  // with its checksum over the bytes as they came: a detector's message): verified and handed on
  // (or, with no consumer, settled) by the receiving thread that took it, not queued for a
  // decompressing thread. At a fast detector's message rates the hand-off between threads costs
  // more than the checksum (docs/performance.md). Not once the run stops taking data: what is
  // taken then is the decompressing threads' to finish.
  static constexpr std::size_t kInlineBytes = 256 << 10;
  bool take_inline(std::optional<Inbound>& in) override {
    const wire::Header& h = in->header;
    if (in->payload().size() > kInlineBytes) return false;
    const auto [to_kept, to_decoded] = consumers_->forms(h.codec);
    const bool keep = to_kept && !to_decoded;
    if (h.codec != Codec::none &&
        !(h.payload_checksum && keep && r_.cfg_.verify != Config::Verify::decode))
      return false;
    const std::size_t via = static_cast<std::size_t>(in->via);
    if (via >= inline_work_.size()) return false;
    inline_active_.fetch_add(1);
    if (r_.stop_taking_) {
      if (inline_active_.fetch_sub(1) == 1) inline_active_.notify_all();
      return false;
    }
    process(in, r_.rt_.stats(Stage::decompress), *inline_work_[via], nullptr);
    if (inline_active_.fetch_sub(1) == 1) inline_active_.notify_all();
    return true;
  }
  bool tracks_in_flight() const override { return consumers_->tracks_in_flight(); }
  void in_flight(bool add, std::uint32_t stream, std::uint64_t seq) override {
    consumers_->in_flight(add, stream, seq);
  }

 private:
  // A chunk that goes to no consumer: taken (null sink), reported corrupt, or a duplicate of one
  // the sink already took: the sender may let it go. A duplicate of one still on its way to the
  // sink is acknowledged when the sink takes the original. (The buffer goes back to its pool with
  // `out`.)
  void settle_here(const Chunk& out, StreamTracker::Verdict verdict, bool forward) {
    const wire::Header& h = out.header;
    if (consumers_->tracks_in_flight()) consumers_->in_flight(false, h.stream_id, h.sequence);
    bool taken = true;
    if (verdict == StreamTracker::Verdict::duplicate && forward) {
      taken = r_.acks_.ledger.contains(h.stream_id, h.sequence);
    }
    if (taken && verdict == StreamTracker::Verdict::corrupt) {
      r_.discard(out.via, h.stream_id, h.sequence);
    } else if (taken) {
      r_.acknowledge(out.via, h.stream_id, h.sequence);
    }
  }

  // What a thread that verifies chunks keeps between them.
  struct Work {
    explicit Work(std::size_t chunk_bytes) : dec(chunk_bytes) {}
    Decompressor dec;
    wire::ChecksumStream sum;  // a decoded chunk's checksum, taken block by block as it is decoded
    std::vector<std::byte> scratch;
  };

  void decompress_loop(StageThread& t) {
    Work w(r_.cfg_.chunk_bytes);
    while (true) {
      // Between chunks: a parked thread (placement.adaptive) waits here for its turn.
      if (!spares_.wait_turn(t.index)) break;
      std::optional<Inbound> in = t.next(*r_.wire_q_);
      if (!in) break;
      if (!process(in, t.stats, w, &t)) break;
    }
  }

  // Verifies chunk `in` and hands it to the consumers in the forms they take, or settles it here.
  // `t` is the decompressing thread doing it (its buffers for decoding, its CPU). False when the
  // pool or the consumers are closed (shutting down).
  bool process(std::optional<Inbound>& in, StageStats& st, Work& w, StageThread* t) {
    Chunk out;
    out.via = in->via;
    wire::Header& h = out.header;
    h = in->header;
    // Who takes the chunk compressed as it came, who takes it decoded: with both, `out` is the
    // decoded chunk and `as_came` the one that came; with one, `out` is it.
    const auto [to_kept, to_decoded] = consumers_->forms(h.codec);
    const bool keep = to_kept && !to_decoded;
    const bool forward = !consumers_->empty();
    std::optional<Chunk> as_came;
    if (to_kept && to_decoded) {
      as_came.emplace();
      as_came->header = h;
      as_came->via = in->via;
    }
    // A payload that goes to the sink as it came stays in the message it came in (its own, for
    // a frame in two parts, or the frame's): nothing is copied into a buffer.
    const bool pass = keep || h.codec == Codec::none;
    if (!pass) {
      NS_ASSERT(t != nullptr);
      out.buffer = t->buffer(raw_pools_->for_node(t->numa_node));
      if (!out.buffer) return false;
    }
    StreamTracker::Verdict verdict;
    {
      ScopedTimer busy(st.busy_ns);
      const std::size_t frame_size = wire::kHeaderSize + in->payload().size();
      const Checked how = keep ? Checked::kept : pass ? Checked::as_is : Checked::decoded;
      const bool ok = verify(*in, how, r_.cfg_.verify, w.dec, w.sum, w.scratch, out, as_came);
      st.bytes_in += frame_size;
      in.reset();  // frees ZeroMQ's message
      verdict = r_.tracker_.on_chunk(h.stream_id, h.sequence, ok, h.raw_size);
      if (verdict == StreamTracker::Verdict::corrupt) {
        log_warn("stream " + std::to_string(h.stream_id) + ": chunk " + std::to_string(h.sequence) +
                 " failed verification (decode or checksum)");
      }
    }
    if (verdict == StreamTracker::Verdict::delivered) {
      st.chunks++;
      st.bytes_out += h.raw_size;
      r_.counts_.last_ns = std::max<std::int64_t>(r_.counts_.last_ns.load(),
                                                  (Clock::now() - r_.rt_.started).count());
    }
    if (t) t->observe();
    if (preview_ && verdict == StreamTracker::Verdict::delivered &&
        preview_->due(h.stream_id, h.raw_size)) {
      // Decoded, or as it came (not compressed, or kept compressed for every consumer).
      const std::span<const std::byte> bytes =
          pass ? std::span<const std::byte>(out.payload())
               : std::span<const std::byte>(out.buffer->data + wire::kHeaderSize, h.raw_size);
      preview_->offer(h.stream_id, h.sequence, keep ? h.codec : Codec::none, h.element_size,
                      h.raw_size, bytes, r_.meta_.of(h.stream_id));
    }
    if (verdict != StreamTracker::Verdict::delivered || !forward) {
      settle_here(out, verdict, forward);
      return true;
    }
    reframe(out, as_came, keep, w.sum.digest());
    return consumers_->deliver(out, as_came, st);
  }

  Receiver& r_;
  std::unique_ptr<NodePools> raw_pools_;
  std::unique_ptr<ConsumerSet> consumers_;
  std::unique_ptr<Preview> preview_;  // preview.enabled: the latest frame of each stream, drawn
  adaptive::CodecSpares spares_;
  // Each receiving thread's own, for the chunks it verifies itself (take_inline), and how many of
  // them are doing so now.
  std::vector<std::unique_ptr<Work>> inline_work_;
  std::atomic<int> inline_active_{0};
};

std::unique_ptr<Receiver::Role> Receiver::decoding(Receiver& r) {
  return std::make_unique<Decoding>(r);
}

}  // namespace numastream
