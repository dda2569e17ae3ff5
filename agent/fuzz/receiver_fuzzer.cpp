// libFuzzer target: the receiving state machine, fed only well-formed frames. Each input is a
// script of frames from several peers (streams, connections, resumes with floors and lists,
// data, gaps, end-of-stream totals, duplicates), every one built with the wire encoder (valid
// header checks and checksums) and decoded again as the receiving thread does, then applied to
// the receiver's record of its streams as receiver.cpp applies it: admit, resume, gaps, end of
// stream, chunks delivered or corrupt, the acknowledged ledger. Numbers are drawn from every
// magnitude (near the stream's floor, far ahead, 2^40, 2^64-1).
//
// What must hold whatever the script: the record stays within its configured bounds (streams,
// a window of bits per stream, gaps), nothing takes time in proportion to a number a frame
// carries (libFuzzer's -timeout catches it), and the accounting stays consistent (what is lost
// is at least what was declared missing; past_gaps never goes back).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "data/seqset.hpp"
#include "wire/tracker.hpp"
#include "wire/wire.hpp"

namespace {

using namespace numastream;

constexpr std::size_t kStreams = 4;
constexpr std::uint64_t kWindow = 1 << 12;

class Script {
 public:
  Script(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
  bool more() const { return p_ < end_; }
  std::uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
  // A sequence number near `base`, or of any magnitude.
  std::uint64_t seq(std::uint64_t base) {
    switch (byte() % 6) {
      case 0:
        return base + byte();
      case 1:
        return base > 0 ? base - 1 - byte() % (base < 256 ? base : 256) : 0;
      case 2:
        return base + kWindow - 1 + byte() % 4;  // the window's edge
      case 3:
        return std::uint64_t{1} << 40;
      case 4:
        return ~std::uint64_t{0} - byte();
      default:
        return u64();
    }
  }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

void fail(const char* why) {
  fprintf(stderr, "receiver_fuzzer: %s\n", why);
  std::abort();
}

// Decodes a frame the way the receiving thread does; the header, or abort (an encoder and a
// decoder that disagree is a bug too).
wire::Header decoded(const std::vector<std::byte>& frame) {
  wire::Header h;
  if (wire::decode(frame, 1 << 20, h) != wire::DecodeError::ok)
    fail("a well-formed frame did not decode");
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Script in(data, size);
  StreamTracker tracker(kStreams, kWindow);
  std::vector<SeqSet>
      ledgers;  // the acknowledged ledger per stream id % kStreams (bounded the same way)
  for (std::size_t i = 0; i < kStreams; ++i) ledgers.emplace_back(kWindow);
  std::uint64_t floors[8] = {};
  for (int step = 0; in.more() && step < 4096; ++step) {
    const std::uint8_t op = in.byte();
    // Stream ids: mostly a few, sometimes any.
    const std::uint32_t stream = (op & 0x80) ? static_cast<std::uint32_t>(in.u64()) : (op >> 4) % 8;
    std::uint64_t& base = floors[stream % 8];
    SeqSet& ledger = ledgers[stream % kStreams];
    const auto connections = static_cast<std::uint16_t>(1 + in.byte() % 4);
    const auto connection = static_cast<std::uint16_t>(in.byte() % connections);
    switch (op % 8) {
      case 0: {  // resume: a floor and a list
        const std::uint64_t floor = in.seq(base);
        std::vector<std::uint64_t> list(in.byte() % 64);
        for (auto& q : list) q = in.seq(floor);
        if (in.byte() % 16 == 0) {  // now and then a list of the wire's maximum length
          list.resize(wire::kMaxAckEntries);
          const std::uint64_t at = in.seq(floor);
          for (std::size_t i = 0; i < list.size(); ++i) list[i] = at + i;
        }
        for (const auto& f : wire::encode_acks(wire::FrameType::resume, stream, connection,
                                               connections, floor, 0, list)) {
          const wire::Header h = decoded(f);
          const auto seqs = wire::decode_ack_list(f);
          if (tracker.on_resume(h.stream_id, h.sequence, seqs) == wire::DecodeError::ok) {
            ledger.merge(h.sequence, seqs);
            base = std::max(base, h.sequence);
          }
        }
        break;
      }
      case 1:
      case 2:
      case 3: {  // data, delivered or corrupt, then acknowledged as the sink takes it
        const std::uint64_t q = in.seq(base);
        const bool ok = in.byte() % 8 != 0;
        if (tracker.admit(stream, q) != wire::DecodeError::ok) break;
        tracker.on_frame(stream, 64);
        if (tracker.on_chunk(stream, q, ok, 64) != StreamTracker::Verdict::duplicate)
          ledger.insert(q);
        break;
      }
      case 4: {  // gaps
        std::vector<wire::Gap> gaps(1 + in.byte() % 4);
        for (auto& g : gaps) {
          g.first = in.seq(base);
          const std::uint64_t len = in.byte() % 3 == 0 ? in.seq(0) : 1 + in.byte();
          g.end = g.first + std::max<std::uint64_t>(1, len);
          if (g.end <= g.first) g.end = ~std::uint64_t{0};
          if (g.end <= g.first) g.first = g.end - 1;
          g.reason = static_cast<wire::GapReason>(1 + in.byte() % 3);
        }
        const auto frame = wire::encode_gaps(stream, connection, connections, gaps);
        decoded(frame);
        const auto back = wire::decode_gaps(frame);
        if (back != gaps) fail("gaps changed on the wire");
        if (tracker.on_gaps(stream, back) == wire::DecodeError::ok) {
          for (const auto& g : tracker.gaps(stream)) {
            if (g.first <= ledger.floor()) {
              ledger.raise_floor(g.end);
            } else {
              for (std::uint64_t q = g.first; q < g.end && ledger.fits(q); ++q) ledger.insert(q);
            }
          }
        }
        break;
      }
      case 5: {  // end of stream with totals of any size
        wire::Header h;
        h.type = wire::FrameType::end_of_stream;
        h.stream_id = stream;
        h.connection = connection;
        h.connections = connections;
        const wire::EndOfStream eos{in.seq(base), in.u64(), in.u64()};
        h.sequence = eos.total_chunks;
        h.payload_size = wire::kEndOfStreamPayload;
        std::vector<std::byte> frame(wire::kHeaderSize + wire::kEndOfStreamPayload);
        wire::encode_header(h, frame.data());
        wire::encode_end_of_stream(eos, frame.data() + wire::kHeaderSize);
        tracker.on_end_of_stream(decoded(frame), wire::decode_end_of_stream(frame));
        break;
      }
      case 6: {  // what a sink asks: where to write next
        const std::uint64_t q = in.seq(base);
        if (tracker.past_gaps(stream, q) < q) fail("past_gaps went back");
        break;
      }
      default: {  // what the metrics and the summary read
        const auto t = tracker.totals();
        if (t.lost < t.declared_missing) fail("fewer lost than declared missing");
        const auto j = tracker.streams_json(8);
        if (j.size() > kStreams) fail("more streams held than allowed");
        break;
      }
    }
    // The bound: per stream two windows of bits (settled, and of those resumed) and its gaps.
    if (tracker.held_bytes() >
        kStreams * (2 * (kWindow / 8 + 8) + StreamTracker::kMaxGaps * sizeof(wire::Gap))) {
      fail("the record outgrew its bound");
    }
    for (const auto& l : ledgers) {
      if (l.bitmap_bytes() > kWindow / 8 + 8) fail("a ledger outgrew its window");
    }
  }
  return 0;
}
