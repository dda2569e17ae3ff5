#include "wire/wire.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace numastream::wire {
namespace {

template <typename T>
void put(std::byte* p, T v) noexcept {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    p[i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
  }
}

template <typename T>
T get(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  }
  return static_cast<T>(v);
}

// Header layout (offsets in bytes, little-endian):
//  0 magic u32 | 4 version u8 | 5 type u8 | 6 codec u8 | 7 flags u8
//    flags: bit 0 the checksum covers the payload; bits 1-3 zero; bits 4-7 the element size
//    (bslz4 only, else 0)
//  8 stream_id u32 | 12 connection u16 | 14 connections u16 | 16 sequence u64
// 24 raw_size u32 | 28 payload_size u32 | 32 checksum u64 | 40 header_check u32 | 44 reserved u32
// (0)
constexpr std::size_t kCheckedBytes = 40;

std::uint32_t header_check(const std::byte* h) noexcept { return XXH32(h, kCheckedBytes, 0x4e53u); }

}  // namespace

std::string_view decode_error_name(DecodeError e) noexcept {
  switch (e) {
    case DecodeError::ok:
      return "ok";
    case DecodeError::truncated:
      return "truncated";
    case DecodeError::bad_magic:
      return "bad_magic";
    case DecodeError::bad_version:
      return "bad_version";
    case DecodeError::bad_header_check:
      return "bad_header_check";
    case DecodeError::bad_type:
      return "bad_type";
    case DecodeError::bad_codec:
      return "bad_codec";
    case DecodeError::size_mismatch:
      return "size_mismatch";
    case DecodeError::oversized:
      return "oversized";
    case DecodeError::bad_connection:
      return "bad_connection";
    case DecodeError::bad_origin:
      return "bad_origin";
    case DecodeError::out_of_window:
      return "out_of_window";
    case DecodeError::too_many_streams:
      return "too_many_streams";
    case DecodeError::contradicts_stream:
      return "contradicts_stream";
  }
  return "unknown";
}

std::string_view gap_reason_name(GapReason r) noexcept {
  switch (r) {
    case GapReason::sender_restarted:
      return "sender_restarted";
    case GapReason::sender_restarted_bound:
      return "sender_restarted_bound";
    case GapReason::spill_full:
      return "spill_full";
    case GapReason::gateway_discarded:
      return "gateway_discarded";
  }
  return "unknown";
}

void encode_header(const Header& h, std::byte* out) noexcept {
  put<std::uint32_t>(out + 0, kMagic);
  put<std::uint8_t>(out + 4, kVersion);
  put<std::uint8_t>(out + 5, static_cast<std::uint8_t>(h.type));
  put<std::uint8_t>(out + 6, static_cast<std::uint8_t>(h.codec));
  put<std::uint8_t>(out + 7, static_cast<std::uint8_t>((h.payload_checksum ? 1u : 0u) |
                                                       ((h.element_size & 0x0fu) << 4)));
  put<std::uint32_t>(out + 8, h.stream_id);
  put<std::uint16_t>(out + 12, h.connection);
  put<std::uint16_t>(out + 14, h.connections);
  put<std::uint64_t>(out + 16, h.sequence);
  put<std::uint32_t>(out + 24, h.raw_size);
  put<std::uint32_t>(out + 28, h.payload_size);
  put<std::uint64_t>(out + 32, h.checksum);
  put<std::uint32_t>(out + 40, header_check(out));
  put<std::uint32_t>(out + 44, 0);
}

std::uint32_t stream_of(const std::byte* header) noexcept { return get<std::uint32_t>(header + 8); }

void restamp_stream(std::byte* header, std::uint32_t stream) noexcept {
  put<std::uint32_t>(header + 8, stream);
  put<std::uint32_t>(header + 40, header_check(header));
}

void encode_end_of_stream(const EndOfStream& eos, std::byte* out) noexcept {
  put<std::uint64_t>(out + 0, eos.total_chunks);
  put<std::uint64_t>(out + 8, eos.total_raw_bytes);
  put<std::uint64_t>(out + 16, eos.connection_chunks);
}

namespace {

// The header of a frame of `size` bytes (p holds at least its kHeaderSize bytes): checked and
// decoded, its flags byte into `flags`.
DecodeError decode_header(const std::byte* p, std::size_t size, Header& h,
                          std::uint8_t& flags) noexcept {
  if (get<std::uint32_t>(p) != kMagic) return DecodeError::bad_magic;
  if (get<std::uint8_t>(p + 4) != kVersion) return DecodeError::bad_version;
  if (get<std::uint32_t>(p + 40) != header_check(p)) return DecodeError::bad_header_check;
  // Unused flag bits and the reserved word are zero; anything else is a peer we do not understand.
  flags = get<std::uint8_t>(p + 7);
  if ((flags & 0x0e) != 0 || get<std::uint32_t>(p + 44) != 0) return DecodeError::bad_version;
  std::uint8_t type = get<std::uint8_t>(p + 5);
  if (type < static_cast<std::uint8_t>(FrameType::data) ||
      type > static_cast<std::uint8_t>(FrameType::gap)) {
    return DecodeError::bad_type;
  }
  std::uint8_t codec = get<std::uint8_t>(p + 6);
  if (!codec_known(codec)) return DecodeError::bad_codec;

  h.type = static_cast<FrameType>(type);
  h.codec = static_cast<Codec>(codec);
  h.stream_id = get<std::uint32_t>(p + 8);
  h.connection = get<std::uint16_t>(p + 12);
  h.connections = get<std::uint16_t>(p + 14);
  h.sequence = get<std::uint64_t>(p + 16);
  h.raw_size = get<std::uint32_t>(p + 24);
  h.payload_size = get<std::uint32_t>(p + 28);
  h.checksum = get<std::uint64_t>(p + 32);
  h.payload_checksum = (flags & 1) != 0;
  h.element_size = static_cast<std::uint8_t>(flags >> 4);

  if (h.connections == 0 || h.connection >= h.connections) return DecodeError::bad_connection;
  if (h.payload_size != size - kHeaderSize) return DecodeError::size_mismatch;
  return DecodeError::ok;
}

// What a data frame's header must say beyond its own checks.
DecodeError check_data(const Header& h, std::size_t max_raw) noexcept {
  if (h.raw_size > max_raw) return DecodeError::oversized;
  if ((h.codec == Codec::bslz4) != (h.element_size != 0)) return DecodeError::bad_codec;
  if (h.codec == Codec::bslz4 &&
      (!valid_element_size(h.element_size) || h.raw_size % h.element_size != 0)) {
    return DecodeError::bad_codec;
  }
  if (h.codec == Codec::none) {
    if (h.payload_size != h.raw_size) return DecodeError::size_mismatch;
  } else if (h.payload_size == 0 || h.payload_size > max_encoded_size(h.raw_size)) {
    return DecodeError::size_mismatch;
  }
  return DecodeError::ok;
}

}  // namespace

DecodeError decode_data_header(std::span<const std::byte> head, std::size_t frame_size,
                               std::size_t max_raw, Header& out) noexcept {
  if (head.size() < kHeaderSize || frame_size < kHeaderSize) return DecodeError::truncated;
  Header h;
  std::uint8_t flags;
  if (auto e = decode_header(head.data(), frame_size, h, flags); e != DecodeError::ok) return e;
  if (h.type != FrameType::data) return DecodeError::bad_type;
  if (auto e = check_data(h, max_raw); e != DecodeError::ok) return e;
  out = h;
  return DecodeError::ok;
}

DecodeError decode(std::span<const std::byte> m, std::size_t max_raw, Header& out) noexcept {
  if (m.size() < kHeaderSize) return DecodeError::truncated;
  const std::byte* p = m.data();
  Header h;
  std::uint8_t flags;
  if (auto e = decode_header(p, m.size(), h, flags); e != DecodeError::ok) return e;
  if (h.type == FrameType::end_of_stream) {
    if (h.payload_size != kEndOfStreamPayload) return DecodeError::size_mismatch;
    out = h;
    return DecodeError::ok;
  }
  if (h.type == FrameType::ack || h.type == FrameType::resume) {
    if (h.payload_size % 8 != 0 || h.payload_size / 8 > kMaxAckEntries) {
      return DecodeError::size_mismatch;
    }
    if (h.codec != Codec::none || h.checksum != 0 ||
        h.raw_size > (kAckEndOfStream | kAckDiscarded | kAckTwoPart) || flags != 0) {
      return DecodeError::bad_type;
    }
    out = h;
    return DecodeError::ok;
  }
  if (h.type == FrameType::metadata) {
    if (h.payload_size > kMaxMetadata || h.raw_size != h.payload_size || h.codec != Codec::none ||
        flags != 0) {
      return DecodeError::size_mismatch;
    }
    if (checksum(m.subspan(kHeaderSize)) != h.checksum) return DecodeError::bad_header_check;
    out = h;
    return DecodeError::ok;
  }
  if (h.type == FrameType::gap) {
    if (h.payload_size == 0 || h.payload_size % kGapRecord != 0 ||
        h.payload_size / kGapRecord > kMaxGapRecords || h.raw_size != h.payload_size ||
        h.codec != Codec::none || flags != 0) {
      return DecodeError::size_mismatch;
    }
    if (checksum(m.subspan(kHeaderSize)) != h.checksum) return DecodeError::bad_header_check;
    // Every record names a non-empty range and a known reason.
    for (std::size_t off = kHeaderSize; off < m.size(); off += kGapRecord) {
      const auto first = get<std::uint64_t>(p + off), end = get<std::uint64_t>(p + off + 8);
      const auto reason = get<std::uint64_t>(p + off + 16);
      if (end <= first || reason < 1 || reason > kLastGapReason) return DecodeError::bad_type;
    }
    out = h;
    return DecodeError::ok;
  }
  if (auto e = check_data(h, max_raw); e != DecodeError::ok) return e;
  out = h;
  return DecodeError::ok;
}

std::vector<std::byte> encode_ack(FrameType type, std::uint32_t stream, std::uint16_t connection,
                                  std::uint16_t connections, std::uint64_t floor,
                                  std::uint32_t flags, std::span<const std::uint64_t> seqs) {
  const std::size_t n = std::min(seqs.size(), kMaxAckEntries);
  std::vector<std::byte> out(kHeaderSize + 8 * n);
  Header h;
  h.type = type;
  h.codec = Codec::none;
  h.stream_id = stream;
  h.connection = connection;
  h.connections = connections;
  h.sequence = floor;
  h.raw_size = flags;
  h.payload_size = static_cast<std::uint32_t>(8 * n);
  encode_header(h, out.data());
  for (std::size_t i = 0; i < n; ++i) put<std::uint64_t>(out.data() + kHeaderSize + 8 * i, seqs[i]);
  return out;
}

std::vector<std::vector<std::byte>> encode_acks(FrameType type, std::uint32_t stream,
                                                std::uint16_t connection, std::uint16_t connections,
                                                std::uint64_t floor, std::uint32_t flags,
                                                std::span<const std::uint64_t> seqs) {
  std::vector<std::vector<std::byte>> out;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(seqs.size() - at, kMaxAckEntries);
    out.push_back(
        encode_ack(type, stream, connection, connections, floor, flags, seqs.subspan(at, n)));
    at += n;
  } while (at < seqs.size());
  return out;
}

std::vector<std::byte> encode_metadata(std::uint32_t stream, std::uint16_t connection,
                                       std::uint16_t connections, std::string_view text) {
  const std::size_t n = std::min(text.size(), kMaxMetadata);
  std::vector<std::byte> out(kHeaderSize + n);
  if (n) std::memcpy(out.data() + kHeaderSize, text.data(), n);
  Header h;
  h.type = FrameType::metadata;
  h.stream_id = stream;
  h.connection = connection;
  h.connections = connections;
  h.raw_size = static_cast<std::uint32_t>(n);
  h.payload_size = static_cast<std::uint32_t>(n);
  h.checksum = checksum({out.data() + kHeaderSize, n});
  encode_header(h, out.data());
  return out;
}

std::vector<std::byte> encode_gaps(std::uint32_t stream, std::uint16_t connection,
                                   std::uint16_t connections, std::span<const Gap> gaps) {
  if (gaps.size() > kMaxGapRecords) {
    throw std::invalid_argument(std::to_string(gaps.size()) + " gaps in one gap frame (at most " +
                                std::to_string(kMaxGapRecords) + ")");
  }
  const std::size_t n = gaps.size();
  std::vector<std::byte> out(kHeaderSize + kGapRecord * n);
  for (std::size_t i = 0; i < n; ++i) {
    std::byte* r = out.data() + kHeaderSize + kGapRecord * i;
    put<std::uint64_t>(r, gaps[i].first);
    put<std::uint64_t>(r + 8, gaps[i].end);
    put<std::uint64_t>(r + 16, static_cast<std::uint64_t>(gaps[i].reason));
  }
  Header h;
  h.type = FrameType::gap;
  h.stream_id = stream;
  h.connection = connection;
  h.connections = connections;
  h.raw_size = static_cast<std::uint32_t>(kGapRecord * n);
  h.payload_size = h.raw_size;
  h.checksum = checksum({out.data() + kHeaderSize, kGapRecord * n});
  encode_header(h, out.data());
  return out;
}

std::vector<Gap> decode_gaps(std::span<const std::byte> m) {
  std::vector<Gap> out((m.size() - kHeaderSize) / kGapRecord);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::byte* r = m.data() + kHeaderSize + kGapRecord * i;
    out[i] = {get<std::uint64_t>(r), get<std::uint64_t>(r + 8),
              static_cast<GapReason>(get<std::uint64_t>(r + 16))};
  }
  return out;
}

std::vector<std::uint64_t> decode_ack_list(std::span<const std::byte> m) {
  std::vector<std::uint64_t> out((m.size() - kHeaderSize) / 8);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = get<std::uint64_t>(m.data() + kHeaderSize + 8 * i);
  return out;
}

EndOfStream decode_end_of_stream(std::span<const std::byte> m) noexcept {
  const std::byte* p = m.data() + kHeaderSize;
  EndOfStream e;
  e.total_chunks = get<std::uint64_t>(p + 0);
  e.total_raw_bytes = get<std::uint64_t>(p + 8);
  e.connection_chunks = get<std::uint64_t>(p + 16);
  return e;
}

std::uint64_t checksum_portable(std::span<const std::byte> raw) noexcept {
  return XXH3_64bits(raw.data(), raw.size());
}

namespace {
bool cpu_has_avx2() noexcept {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;  // the library's XXH3 uses the CPU's own vector unit (NEON on arm64)
#endif
}
}  // namespace

std::uint64_t checksum(std::span<const std::byte> raw) noexcept {
  // The library's XXH3 is built for SSE2 (any x86-64); AVX2 reads twice as much per step.
  if (cpu_has_avx2()) return detail::xxh3_avx2(raw.data(), raw.size());
  return XXH3_64bits(raw.data(), raw.size());
}

ChecksumStream::ChecksumStream(bool portable)
    : avx2_(!portable && cpu_has_avx2()),
      state_(avx2_ ? detail::xxh3_state_avx2() : XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  reset();
}

ChecksumStream::~ChecksumStream() {
  if (avx2_) {
    detail::xxh3_free_avx2(state_);
  } else {
    XXH3_freeState(static_cast<XXH3_state_t*>(state_));
  }
}

void ChecksumStream::reset() noexcept {
  if (avx2_) {
    detail::xxh3_reset_avx2(state_);
  } else {
    XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
  }
}

void ChecksumStream::raw(std::span<const std::byte> piece) noexcept {
  if (avx2_) {
    detail::xxh3_update_avx2(state_, piece.data(), piece.size());
  } else {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), piece.data(), piece.size());
  }
}

std::uint64_t ChecksumStream::digest() const noexcept {
  return avx2_ ? detail::xxh3_digest_avx2(state_)
               : XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace numastream::wire
