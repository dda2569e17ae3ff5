// libFuzzer target: everything a receiver does with bytes from the network before it trusts
// them. decode() must accept or refuse any message without reading outside it; an accepted data
// frame is decompressed into a buffer of exactly raw_size bytes (out-of-bounds reads or writes
// are caught by AddressSanitizer) and checksummed; ack, resume and end-of-stream payloads are
// read as the receiver and sender read them, into the receiver's own record of its streams. Each
// input is tried as it is and, so that mutations get past the header check to the code behind it,
// once more with the check re-stamped. The input's bytes also go through every bit-shuffle
// kernel the CPU runs, which must all write the portable kernel's bytes.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "codec/bitshuffle.hpp"
#include "codec/codec.hpp"
#include "data/seqset.hpp"
#include "wire/stream_names.hpp"
#include "wire/tracker.hpp"
#include "wire/wire.hpp"

namespace {
constexpr std::size_t kMaxRaw = 1 << 20;  // the receiver's chunk_bytes in this harness

void exercise(std::span<const std::byte> msg) {
  using namespace numastream;
  static Decompressor dec(kMaxRaw);
  wire::Header h;
  if (wire::decode(msg, kMaxRaw, h) != wire::DecodeError::ok) return;
  switch (h.type) {
    case wire::FrameType::data: {
      // Exactly raw_size bytes, as the receiver allocates: a decoder that writes more is caught.
      auto raw = std::make_unique<std::byte[]>(h.raw_size);
      std::span<std::byte> dst(raw.get(), h.raw_size);
      auto payload = msg.subspan(wire::kHeaderSize);
      if (h.payload_checksum) {  // what a gateway checks of a frame it stores without decoding
        volatile bool framed =
            h.codec == Codec::bslz4 && bslz4::check_framing(payload, h.element_size, h.raw_size);
        volatile auto sum = wire::checksum(payload);
        (void)framed;
        (void)sum;
      }
      if (dec.decompress(h.codec, payload, dst, h.element_size)) {
        volatile auto sum = wire::checksum(dst);
        (void)sum;
      }
      break;
    }
    case wire::FrameType::end_of_stream: {
      volatile auto eos = wire::decode_end_of_stream(msg).total_chunks;
      (void)eos;
      break;
    }
    case wire::FrameType::metadata: {  // parsed as the HDF5 sink parses it
      auto body = msg.subspan(wire::kHeaderSize);
      auto doc = nlohmann::json::parse(reinterpret_cast<const char*>(body.data()),
                                       reinterpret_cast<const char*>(body.data()) + body.size(),
                                       nullptr, false);
      volatile bool usable = !doc.is_discarded() && doc.is_object() && doc.contains("shape");
      (void)usable;
      // As the receiver reads an origin frame: an origin it takes is one a file path may hold.
      if (auto origin = origin_of_metadata(body); origin && !origin->empty()) {
        if (!origin_name_problem(*origin).empty() || origin->find('/') != std::string::npos)
          __builtin_trap();
        StreamNames names({"/d/{origin}/{stream}"}, 4);
        if (names.local(*origin, h.stream_id).why != wire::DecodeError::ok) __builtin_trap();
      }
      break;
    }
    case wire::FrameType::ack:
    case wire::FrameType::resume: {
      // The floor and the list as they come: the set and the receiver's record bound themselves.
      const auto list = wire::decode_ack_list(msg);
      SeqSet set;
      set.merge(h.sequence, list);
      StreamTracker tracker;
      tracker.on_resume(h.stream_id, h.sequence, list);
      break;
    }
    case wire::FrameType::gap: {
      StreamTracker tracker;
      tracker.on_gaps(h.stream_id, wire::decode_gaps(msg));
      volatile auto next = tracker.past_gaps(h.stream_id, 0);
      (void)next;
      break;
    }
  }
}

}  // namespace

// Every bit-shuffle kernel this CPU runs writes the portable kernel's bytes, both ways, for any
// bytes and any whole number of 8-element groups (the first byte picks the element size, 1-8).
void kernels_agree(std::span<const std::byte> in) {
  using namespace numastream::bslz4;
  if (in.size() < 2) return;
  const std::size_t e = 1 + (std::to_integer<std::size_t>(in[0]) & 7);
  const std::size_t n = (in.size() - 1) / e / 8 * 8;
  if (n == 0) return;
  const std::byte* src = in.data() + 1;
  std::vector<std::byte> want(n * e), back_want(n * e), got(n * e), back(n * e);
  shuffle_bits_portable(src, want.data(), n, e);
  unshuffle_bits_portable(src, back_want.data(), n, e);
  static const std::vector<Kernel> kernels = kernels_available();
  for (const Kernel k : kernels) {
    shuffle_bits(src, got.data(), n, e, k);
    unshuffle_bits(src, back.data(), n, e, k);
    if (got != want || back != back_want) __builtin_trap();
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> msg(reinterpret_cast<const std::byte*>(data), size);
  exercise(msg);
  kernels_agree(msg);
  if (size >= numastream::wire::kHeaderSize) {
    std::vector<std::byte> fixed(msg.begin(), msg.end());
    std::uint32_t check = XXH32(fixed.data(), 40, 0x4e53u);
    for (int i = 0; i < 4; ++i) fixed[40 + i] = static_cast<std::byte>((check >> (8 * i)) & 0xff);
    exercise(fixed);
  }
  return 0;
}
