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
            std::vector<std::byte>& scratch, Chunk& out, std::optional<Chunk>& as_came) {
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
        ok = dec.decompress(h.codec, payload, scratch, h.element_size) &&
             (h.payload_checksum || wire::checksum(scratch) == h.checksum);
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
      ok = ok && dec.decompress(h.codec, payload, raw, h.element_size) &&
           (h.payload_checksum || wire::checksum(raw) == h.checksum);
      if (ok && as_came) pass_on(in, *as_came);
      break;
    }
  }
  return ok;
}
}  // namespace

// A chunk that goes to no consumer: taken (null sink), reported corrupt, or a duplicate of one the
// sink already took: the sender may let it go. A duplicate of one still on its way to the sink
// is acknowledged when the sink takes the original. (The buffer goes back to its pool with `out`.)
void Receiver::settle_here(const Chunk& out, StreamTracker::Verdict verdict, bool forward) {
  const wire::Header& h = out.header;
  if (consumers_->tracks_in_flight()) consumers_->in_flight(false, h.stream_id, h.sequence);
  bool taken = true;
  if (verdict == StreamTracker::Verdict::duplicate && forward) {
    taken = acks_.ledger.contains(h.stream_id, h.sequence);
  }
  if (taken && verdict == StreamTracker::Verdict::corrupt) {
    discard(out.via, h.stream_id, h.sequence);
  } else if (taken) {
    acknowledge(out.via, h.stream_id, h.sequence);
  }
}

namespace {

// Re-framed for the consumers: a raw chunk (the zmq sink forwards it as is), or the frame as it
// came (`keep`: the bslz4 frame the HDF5 sink stores); each a stream of one connection. A sink
// encodes the header if it sends the frame on.
void reframe(Chunk& out, std::optional<Chunk>& as_came, bool keep) {
  wire::Header& h = out.header;
  if (!keep) {
    // A checksum over a compressed payload is over the raw bytes once decoded; over one that
    // was not compressed it is over the raw bytes already (and was checked).
    const bool recompute = h.payload_checksum && h.codec != Codec::none;
    h.codec = Codec::none;
    h.element_size = 0;
    h.payload_size = h.raw_size;
    if (recompute) h.checksum = wire::checksum(out.payload());
    h.payload_checksum = false;
  }
  h.connection = 0;
  h.connections = 1;
  if (out.buffer) out.buffer->size = wire::kHeaderSize + h.payload_size;
  if (as_came) as_came->header.connection = 0, as_came->header.connections = 1;
}

}  // namespace

void Receiver::decompress_loop(StageThread& t) {
  StageStats& st = t.stats;
  BufferPool& pool = raw_pools_->for_node(t.numa_node);
  Decompressor dec(cfg_.chunk_bytes);
  const bool forward = !consumers_->empty();
  std::vector<std::byte> scratch;
  while (true) {
    // Between chunks: a parked thread (placement.adaptive) waits here for its turn.
    if (!spares_.wait_turn(t.index)) break;
    std::optional<Inbound> in = t.next(*wire_q_);
    if (!in) break;
    Chunk out;
    out.via = in->via;
    wire::Header& h = out.header;
    h = in->header;
    // Who takes the chunk compressed as it came, who takes it decoded: with both, `out` is the
    // decoded chunk and `as_came` the one that came; with one, `out` is it.
    const auto [to_kept, to_decoded] = consumers_->forms(h.codec);
    const bool keep = to_kept && !to_decoded;
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
      out.buffer = t.buffer(pool);
      if (!out.buffer) break;
    }
    StreamTracker::Verdict verdict;
    {
      ScopedTimer busy(st.busy_ns);
      const std::size_t frame_size = wire::kHeaderSize + in->payload().size();
      const Checked how = keep ? Checked::kept : pass ? Checked::as_is : Checked::decoded;
      const bool ok = verify(*in, how, cfg_.verify, dec, scratch, out, as_came);
      st.bytes_in += frame_size;
      in.reset();  // frees ZeroMQ's message
      verdict = tracker_.on_chunk(h.stream_id, h.sequence, ok, h.raw_size);
      if (verdict == StreamTracker::Verdict::corrupt) {
        log_warn("stream " + std::to_string(h.stream_id) + ": chunk " + std::to_string(h.sequence) +
                 " failed verification (decode or checksum)");
      }
    }
    if (verdict == StreamTracker::Verdict::delivered) {
      st.chunks++;
      st.bytes_out += h.raw_size;
      counts_.last_ns =
          std::max<std::int64_t>(counts_.last_ns.load(), (Clock::now() - rt_.started).count());
    }
    t.observe();
    if (preview_ && verdict == StreamTracker::Verdict::delivered &&
        preview_->due(h.stream_id, h.raw_size)) {
      // Decoded, or as it came (not compressed, or kept compressed for every consumer).
      const std::span<const std::byte> bytes =
          pass ? std::span<const std::byte>(out.payload())
               : std::span<const std::byte>(out.buffer->data + wire::kHeaderSize, h.raw_size);
      preview_->offer(h.stream_id, h.sequence, keep ? h.codec : Codec::none, h.element_size,
                      h.raw_size, bytes, meta_.of(h.stream_id));
    }
    if (verdict != StreamTracker::Verdict::delivered || !forward) {
      settle_here(out, verdict, forward);
      continue;
    }
    reframe(out, as_came, keep);
    if (!consumers_->deliver(out, as_came, st)) break;
  }
}

}  // namespace numastream
