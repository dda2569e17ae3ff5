// The numastream wire format, version 3 (docs/wire-format.md). One ZeroMQ message per frame:
// a 48-byte little-endian header followed by the payload; or, to a receiver that says it takes
// them (kAckTwoPart), a data frame as two parts of one message, the header and the payload.
// Decoding never trusts a field: every size is checked against the message and the receiver's
// limits before any byte is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "codec/codec.hpp"

namespace numastream::wire {

inline constexpr std::uint32_t kMagic = 0x5254534E;  // "NSTR" in little-endian byte order
inline constexpr std::uint8_t kVersion = 3;
inline constexpr std::size_t kHeaderSize = 48;
inline constexpr std::size_t kEndOfStreamPayload = 24;

// data and end_of_stream flow from sender to receiver; resume opens every connection (sender to
// receiver: what the stream already had acknowledged); ack flows back (receiver to sender: what
// the sink has taken).
// metadata follows every resume frame of a stream (sender to receiver): what its chunks are
// (pixel type, frame shape) as a small JSON object, for sinks that store frames as frames.
// gap declares chunks that will never be sent (sender to receiver, after every resume frame and
// whenever the sender learns of new ones): a live source's chunks that an earlier sender took and
// never had acknowledged, or chunks a full spill refused. A gap is data too: the receiver counts
// the chunks missing, names them, and never waits for them.
enum class FrameType : std::uint8_t {
  data = 1,
  end_of_stream = 2,
  ack = 3,
  resume = 4,
  metadata = 5,
  gap = 6
};
inline constexpr std::size_t kMaxMetadata = 65536;

// Why a gap's chunks will never come (a gap frame's records carry it).
enum class GapReason : std::uint8_t {
  // A previous sender of a live source took them and never had them acknowledged.
  sender_restarted = 1,
  // The same, counted from a record that may be short (its node restarted): at most this many.
  sender_restarted_bound = 2,
  // A full spill refused them (a source that cannot wait).
  spill_full = 3,
  // A gateway settled them without keeping them (corrupt on arrival, or arrived after its sink
  // had passed over them): declared to the gateways after it, so their losses survive that
  // gateway however it ends.
  gateway_discarded = 4,
};
// The reasons a gap frame or a state record may carry: 1 ..= kLastGapReason.
inline constexpr std::uint64_t kLastGapReason = 4;
std::string_view gap_reason_name(GapReason r) noexcept;
// One declared gap: sequences [first, end).
struct Gap {
  std::uint64_t first = 0, end = 0;
  GapReason reason = GapReason::sender_restarted;
  std::uint64_t size() const noexcept { return end - first; }
  bool operator==(const Gap&) const = default;
};
// A gap frame's payload: records of 24 bytes (first u64, end u64, reason u64), at most this many.
inline constexpr std::size_t kGapRecord = 24;
inline constexpr std::size_t kMaxGapRecords = 1024;
// Separate gaps one stream may declare in all (a receiver keeps every one of them): sent in as
// many gap frames as they take.
inline constexpr std::size_t kMaxDeclaredGaps = 4096;

// Ack and resume frames: header.sequence is a floor (every sequence below it is acknowledged)
// and the payload lists acknowledged sequences at or above the floor, u64 each, at most this many.
inline constexpr std::size_t kMaxAckEntries = 65536;
// Ack flag, carried in header.raw_size: the end-of-stream frame of this connection was recorded.
inline constexpr std::uint32_t kAckEndOfStream = 1;
// Ack flag: the listed sequences were settled without being kept (corrupt, or past the sink):
// the sender declares them gone (GapReason::gateway_discarded) to every later gateway.
inline constexpr std::uint32_t kAckDiscarded = 2;
// Ack flag: this receiver takes a data frame in two parts, its header (kHeaderSize bytes) and then
// its payload, so a payload the sender got whole from a detector travels without being copied.
// Sent in an ack frame of its own (floor 0, no sequences) before the answer to a resume frame: a
// sender that does not know the flag drops that frame and sends frames whole, as it always did.
inline constexpr std::uint32_t kAckTwoPart = 4;

struct Header {
  FrameType type = FrameType::data;
  Codec codec = Codec::none;
  std::uint32_t stream_id = 0;
  std::uint16_t connection = 0;    // which of the sender's connections carried the frame
  std::uint16_t connections = 0;   // how many connections the sender uses
  std::uint64_t sequence = 0;      // chunk number within the stream, from 0
  std::uint32_t raw_size = 0;      // bytes after decoding
  std::uint32_t payload_size = 0;  // bytes after the header
  std::uint64_t checksum = 0;      // XXH3-64 of the raw bytes, or of the payload (below)
  // The checksum covers the payload as sent, not the raw bytes: a frame that arrived compressed
  // (from a detector or an HDF5 file) and travels without being decoded.
  bool payload_checksum = false;
  std::uint8_t element_size = 0;  // bslz4: bytes per sample (1, 2, 4, 8); 0 for other codecs
};

// Totals carried by an end-of-stream frame (one per connection).
struct EndOfStream {
  std::uint64_t total_chunks = 0;       // chunks the stream produced, on all connections
  std::uint64_t total_raw_bytes = 0;    // raw bytes the stream produced
  std::uint64_t connection_chunks = 0;  // data frames sent on this connection
};

enum class DecodeError : std::uint8_t {
  ok = 0,
  truncated,  // shorter than a header
  bad_magic,
  bad_version,
  bad_header_check,  // header bytes damaged
  bad_type,
  bad_codec,
  size_mismatch,   // payload_size disagrees with the message length or the codec
  oversized,       // raw size above the receiver's limit
  bad_connection,  // connection index outside the connection count
  bad_origin,  // an origin frame naming no allowed origin, or another origin than its connection's
  // Refused by the receiver's record of the stream, after decoding (docs/wire-format.md):
  out_of_window,       // a sequence, floor or gap beyond the chunks a stream may have in flight
  too_many_streams,    // a new stream id past the receiver's max_streams
  contradicts_stream,  // end-of-stream totals below what arrived, or unlike another connection's
};
inline constexpr int kDecodeErrorCount = 14;
std::string_view decode_error_name(DecodeError e) noexcept;

void encode_header(const Header& h, std::byte* out) noexcept;  // writes kHeaderSize bytes
// The stream id of an encoded frame (its header check made again to match).
std::uint32_t stream_of(const std::byte* header) noexcept;
void restamp_stream(std::byte* header, std::uint32_t stream) noexcept;
void encode_end_of_stream(const EndOfStream& eos, std::byte* out) noexcept;

// Validates and decodes one whole message. `max_raw` is the largest chunk this receiver accepts.
DecodeError decode(std::span<const std::byte> message, std::size_t max_raw, Header& out) noexcept;
// Validates and decodes the header of a data frame of `frame_size` bytes from its first bytes
// (`head`, at least kHeaderSize): what decode() checks of a data frame, without its payload.
DecodeError decode_data_header(std::span<const std::byte> head, std::size_t frame_size,
                               std::size_t max_raw, Header& out) noexcept;
// Builds an ack or resume frame (`type` is one of the two).
std::vector<std::byte> encode_ack(FrameType type, std::uint32_t stream, std::uint16_t connection,
                                  std::uint16_t connections, std::uint64_t floor,
                                  std::uint32_t flags, std::span<const std::uint64_t> seqs);
// The same as frames of at most kMaxAckEntries sequences each (at least one frame): a record
// of any size travels whole, never cut.
std::vector<std::vector<std::byte>> encode_acks(FrameType type, std::uint32_t stream,
                                                std::uint16_t connection, std::uint16_t connections,
                                                std::uint64_t floor, std::uint32_t flags,
                                                std::span<const std::uint64_t> seqs);
// A metadata frame: `text` (at most kMaxMetadata bytes), checksummed.
std::vector<std::byte> encode_metadata(std::uint32_t stream, std::uint16_t connection,
                                       std::uint16_t connections, std::string_view text);
// The sequences listed by an ack or resume frame that decode() accepted.
std::vector<std::uint64_t> decode_ack_list(std::span<const std::byte> message);
// Reads the end-of-stream payload of a message that decode() accepted as end_of_stream.
EndOfStream decode_end_of_stream(std::span<const std::byte> message) noexcept;

// A gap frame declaring `gaps` (at most kMaxGapRecords: more throw std::invalid_argument),
// checksummed.
std::vector<std::byte> encode_gaps(std::uint32_t stream, std::uint16_t connection,
                                   std::uint16_t connections, std::span<const Gap> gaps);
// The gaps of a message that decode() accepted as a gap frame.
std::vector<Gap> decode_gaps(std::span<const std::byte> message);

// XXH3-64 of the raw bytes (with AVX2 where the CPU has it: the same value).
std::uint64_t checksum(std::span<const std::byte> raw) noexcept;
// The library's XXH3-64 (SSE2 on x86-64), which checksum() must always agree with.
std::uint64_t checksum_portable(std::span<const std::byte> raw) noexcept;
namespace detail {
std::uint64_t xxh3_avx2(const void* data, std::size_t size) noexcept;
void* xxh3_state_avx2() noexcept;
void xxh3_free_avx2(void* state) noexcept;
void xxh3_reset_avx2(void* state) noexcept;
void xxh3_update_avx2(void* state, const void* data, std::size_t size) noexcept;
std::uint64_t xxh3_digest_avx2(const void* state) noexcept;
}  // namespace detail

// checksum() of the bytes shown to it, in pieces, in order (what a codec shows of a chunk as it
// works on it: RawObserver): the same value, without a pass over the chunk of its own. One per
// thread; reset() before each chunk.
class ChecksumStream final : public RawObserver {
 public:
  // `portable`: the library's XXH3 even where the CPU has AVX2 (tests).
  explicit ChecksumStream(bool portable = false);
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;
  void reset() noexcept;
  void raw(std::span<const std::byte> piece) noexcept override;
  std::uint64_t digest() const noexcept;

 private:
  bool avx2_;
  void* state_;  // XXH3's state, of the variant avx2_ names
};

}  // namespace numastream::wire
