#include "wire/wire.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

namespace numastream::wire {
namespace {

constexpr std::size_t kMaxRaw = 1 << 20;

std::vector<std::byte> frame(const Header& h, std::size_t payload) {
  std::vector<std::byte> m(kHeaderSize + payload, std::byte{0x5a});
  encode_header(h, m.data());
  return m;
}

Header data_header(std::uint32_t raw, std::uint32_t payload, Codec codec = Codec::lz4) {
  Header h;
  h.type = FrameType::data;
  h.codec = codec;
  h.stream_id = 7;
  h.connection = 1;
  h.connections = 4;
  h.sequence = 123456789012ull;
  h.raw_size = raw;
  h.payload_size = payload;
  h.checksum = 0x0123456789abcdefull;
  return h;
}

// Rewrites one header byte and fixes the header check, to reach the checks behind it.
void poke(std::vector<std::byte>& m, std::size_t offset, std::uint8_t value) {
  m[offset] = static_cast<std::byte>(value);
  std::uint32_t check = XXH32(m.data(), 40, 0x4e53u);
  for (int i = 0; i < 4; ++i) m[40 + i] = static_cast<std::byte>((check >> (8 * i)) & 0xff);
}

DecodeError decode_of(const std::vector<std::byte>& m) {
  Header out;
  return decode(m, kMaxRaw, out);
}

TEST(Wire, DataHeaderRoundTrips) {
  Header h = data_header(1000, 600);
  auto m = frame(h, 600);
  Header out;
  ASSERT_EQ(decode(m, kMaxRaw, out), DecodeError::ok);
  EXPECT_EQ(out.type, FrameType::data);
  EXPECT_EQ(out.codec, Codec::lz4);
  EXPECT_EQ(out.stream_id, 7u);
  EXPECT_EQ(out.connection, 1);
  EXPECT_EQ(out.connections, 4);
  EXPECT_EQ(out.sequence, 123456789012ull);
  EXPECT_EQ(out.raw_size, 1000u);
  EXPECT_EQ(out.payload_size, 600u);
  EXPECT_EQ(out.checksum, 0x0123456789abcdefull);
}

// A data frame's header judged from its first bytes and its size (a spill's records, read back
// without their payloads): what decode() says of the whole frame.
TEST(Wire, ADataHeaderIsJudgedWithoutItsPayload) {
  auto m = frame(data_header(1000, 600), 600);
  const std::span<const std::byte> head(m.data(), 64);
  Header out;
  ASSERT_EQ(decode_data_header(head, m.size(), kMaxRaw, out), DecodeError::ok);
  EXPECT_EQ(out.sequence, 123456789012ull);
  EXPECT_EQ(decode_data_header(head, m.size() - 1, kMaxRaw, out), DecodeError::size_mismatch);
  EXPECT_EQ(decode_data_header(head.first(kHeaderSize - 1), m.size(), kMaxRaw, out),
            DecodeError::truncated);
  EXPECT_EQ(decode_data_header(head, m.size(), 999, out), DecodeError::oversized);
  auto damaged = m;
  damaged[20] ^= std::byte{1};
  EXPECT_EQ(decode_data_header({damaged.data(), 64}, m.size(), kMaxRaw, out),
            DecodeError::bad_header_check);
  const auto eos = frame(
      [] {
        Header h;
        h.type = FrameType::end_of_stream;
        h.connections = 1;
        h.payload_size = kEndOfStreamPayload;
        return h;
      }(),
      kEndOfStreamPayload);
  EXPECT_EQ(decode_data_header({eos.data(), kHeaderSize}, eos.size(), kMaxRaw, out),
            DecodeError::bad_type);
}

TEST(Wire, LayoutIsLittleEndianWithMagicFirst) {
  auto m = frame(data_header(1000, 600), 600);
  EXPECT_EQ(std::memcmp(m.data(), "NSTR", 4), 0);
  EXPECT_EQ(std::to_integer<int>(m[4]), kVersion);
  EXPECT_EQ(std::to_integer<int>(m[16]), 0x14) << "sequence, least significant byte first";
}

TEST(Wire, EndOfStreamRoundTrips) {
  Header h;
  h.type = FrameType::end_of_stream;
  h.connections = 2;
  h.payload_size = kEndOfStreamPayload;
  auto m = frame(h, kEndOfStreamPayload);
  encode_end_of_stream({200, 2211840000ull, 101}, m.data() + kHeaderSize);
  Header out;
  ASSERT_EQ(decode(m, kMaxRaw, out), DecodeError::ok);
  EXPECT_EQ(out.type, FrameType::end_of_stream);
  auto eos = decode_end_of_stream(m);
  EXPECT_EQ(eos.total_chunks, 200u);
  EXPECT_EQ(eos.total_raw_bytes, 2211840000ull);
  EXPECT_EQ(eos.connection_chunks, 101u);
}

TEST(Wire, RejectsTruncated) {
  auto m = frame(data_header(10, 10, Codec::none), 10);
  m.resize(kHeaderSize - 1);
  EXPECT_EQ(decode_of(m), DecodeError::truncated);
  EXPECT_EQ(decode_of({}), DecodeError::truncated);
}

TEST(Wire, RejectsBadMagic) {
  auto m = frame(data_header(10, 10, Codec::none), 10);
  m[0] = std::byte{'X'};
  EXPECT_EQ(decode_of(m), DecodeError::bad_magic);
}

TEST(Wire, RejectsOtherVersions) {
  auto m = frame(data_header(10, 10, Codec::none), 10);
  m[4] = std::byte{1};  // version 1 had no acknowledgements: refused, not misread
  EXPECT_EQ(decode_of(m), DecodeError::bad_version);
  m[4] = std::byte{2};  // version 2 had no bslz4 nor payload checksums
  EXPECT_EQ(decode_of(m), DecodeError::bad_version);
  auto flags = frame(data_header(10, 10, Codec::none), 10);
  poke(flags, 7, 2);
  EXPECT_EQ(decode_of(flags), DecodeError::bad_version) << "unknown flags";
}

TEST(Wire, FlagsCarryThePayloadChecksumAndTheElementSize) {
  Header h = data_header(64, 40, Codec::bslz4);
  h.element_size = 4;
  h.payload_checksum = true;
  auto m = frame(h, 40);
  Header got;
  ASSERT_EQ(decode(m, 1 << 20, got), DecodeError::ok);
  EXPECT_EQ(got.element_size, 4);
  EXPECT_TRUE(got.payload_checksum);
  h.element_size = 0;  // bslz4 without its element size cannot be decoded
  EXPECT_EQ(decode_of(frame(h, 40)), DecodeError::bad_codec);
  h.element_size = 3;
  EXPECT_EQ(decode_of(frame(h, 40)), DecodeError::bad_codec);
  h.element_size = 8;  // 64 bytes are 8 samples of 8 bytes; 60 would not be
  h.raw_size = 60;
  EXPECT_EQ(decode_of(frame(h, 40)), DecodeError::bad_codec);
  Header lz = data_header(64, 40, Codec::lz4);
  lz.element_size = 2;  // only bslz4 has one
  EXPECT_EQ(decode_of(frame(lz, 40)), DecodeError::bad_codec);
}

TEST(Wire, RejectsDamagedHeader) {
  auto m = frame(data_header(10, 10, Codec::none), 10);
  m[20] ^= std::byte{0x01};  // a bit flip in the sequence number
  EXPECT_EQ(decode_of(m), DecodeError::bad_header_check);
}

TEST(Wire, RejectsUnknownTypeAndCodec) {
  auto t = frame(data_header(10, 10, Codec::none), 10);
  poke(t, 5, 9);
  EXPECT_EQ(decode_of(t), DecodeError::bad_type);
  auto c = frame(data_header(10, 10, Codec::none), 10);
  poke(c, 6, 77);
  EXPECT_EQ(decode_of(c), DecodeError::bad_codec);
}

TEST(Wire, RejectsSizesThatLie) {
  // payload_size disagrees with the message length
  EXPECT_EQ(decode_of(frame(data_header(100, 60), 59)), DecodeError::size_mismatch);
  EXPECT_EQ(decode_of(frame(data_header(100, 60), 61)), DecodeError::size_mismatch);
  // codec none must carry exactly raw_size bytes
  EXPECT_EQ(decode_of(frame(data_header(100, 60, Codec::none), 60)), DecodeError::size_mismatch);
  // compressed payload larger than LZ4 could ever produce for that raw size
  EXPECT_EQ(decode_of(frame(data_header(10, 100), 100)), DecodeError::size_mismatch);
  // compressed payload of zero bytes for a non-empty chunk
  EXPECT_EQ(decode_of(frame(data_header(10, 0), 0)), DecodeError::size_mismatch);
  // end of stream with the wrong payload size
  Header e;
  e.type = FrameType::end_of_stream;
  e.connections = 1;
  e.payload_size = 8;
  EXPECT_EQ(decode_of(frame(e, 8)), DecodeError::size_mismatch);
}

TEST(Wire, AckAndResumeFramesRoundTrip) {
  std::vector<std::uint64_t> seqs = {7, 9, 1000000000000ull};
  auto m = encode_ack(FrameType::ack, 3, 1, 4, 5, kAckEndOfStream, seqs);
  Header h;
  ASSERT_EQ(decode(m, 16, h), DecodeError::ok);
  EXPECT_EQ(h.type, FrameType::ack);
  EXPECT_EQ(h.stream_id, 3u);
  EXPECT_EQ(h.connection, 1);
  EXPECT_EQ(h.sequence, 5u) << "the floor";
  EXPECT_EQ(h.raw_size, kAckEndOfStream);
  EXPECT_EQ(decode_ack_list(m), seqs);
  auto r = encode_ack(FrameType::resume, 3, 0, 1, 0, 0, {});
  ASSERT_EQ(decode(r, 16, h), DecodeError::ok);
  EXPECT_EQ(h.type, FrameType::resume);
  EXPECT_TRUE(decode_ack_list(r).empty());
}

TEST(Wire, RejectsAckFramesThatLie) {
  std::vector<std::uint64_t> seqs = {1, 2};
  auto odd = encode_ack(FrameType::ack, 0, 0, 1, 0, 0, seqs);
  odd.pop_back();  // the payload no longer matches payload_size
  EXPECT_EQ(decode_of(odd), DecodeError::size_mismatch);
  Header h;
  h.type = FrameType::ack;
  h.codec = Codec::none;
  h.connections = 1;
  h.payload_size = 12;  // not a whole number of sequences
  EXPECT_EQ(decode_of(frame(h, 12)), DecodeError::size_mismatch);
  h.payload_size = 8;
  h.raw_size = kAckEndOfStream | kAckDiscarded | kAckTwoPart;  // every known flag
  EXPECT_EQ(decode_of(frame(h, 8)), DecodeError::ok);
  h.raw_size = 8;  // an unknown ack flag
  EXPECT_EQ(decode_of(frame(h, 8)), DecodeError::bad_type);
}

TEST(Wire, RejectsOversizedClaims) {
  EXPECT_EQ(decode_of(frame(data_header(kMaxRaw + 1, 100), 100)), DecodeError::oversized);
  EXPECT_EQ(decode_of(frame(data_header(0xFFFFFFFFu, 100), 100)), DecodeError::oversized);
}

TEST(Wire, RejectsConnectionOutsideItsCount) {
  Header h = data_header(10, 10, Codec::none);
  h.connection = 4;
  EXPECT_EQ(decode_of(frame(h, 10)), DecodeError::bad_connection);
  h.connection = 0;
  h.connections = 0;
  EXPECT_EQ(decode_of(frame(h, 10)), DecodeError::bad_connection);
}

// A gap frame carries at most kMaxGapRecords records, every one of them: more is an error for
// the caller (a sender splits them over frames), never a frame that declares less.
TEST(Wire, AGapFrameCarriesEveryGapItIsGivenOrRefuses) {
  std::vector<Gap> gaps;
  for (std::uint64_t i = 0; i < kMaxGapRecords; ++i)
    gaps.push_back({2 * i, 2 * i + 1, GapReason::gateway_discarded});
  const auto frame = encode_gaps(7, 0, 1, gaps);
  Header h;
  ASSERT_EQ(decode(frame, 0, h), DecodeError::ok);
  EXPECT_EQ(decode_gaps(frame), gaps);
  gaps.push_back({2 * kMaxGapRecords, 2 * kMaxGapRecords + 1, GapReason::spill_full});
  EXPECT_THROW(encode_gaps(7, 0, 1, gaps), std::invalid_argument);
}

TEST(Wire, ChecksumSeesEveryByte) {
  std::vector<std::byte> a(4096, std::byte{1});
  auto before = checksum(a);
  a[4000] = std::byte{2};
  EXPECT_NE(checksum(a), before);
  EXPECT_EQ(checksum(a), checksum(a));
}

TEST(Wire, ErrorNamesAreDistinct) {
  for (int i = 0; i < kDecodeErrorCount; ++i) {
    for (int j = i + 1; j < kDecodeErrorCount; ++j) {
      EXPECT_NE(decode_error_name(static_cast<DecodeError>(i)),
                decode_error_name(static_cast<DecodeError>(j)));
    }
  }
}

}  // namespace
}  // namespace numastream::wire

namespace numastream::wire {
namespace {

// checksum() takes AVX2 where the CPU has it; its value is XXH3-64's whatever computes it: the
// library's own build agrees on every length around XXH3's internal boundaries (16, 128, 240
// bytes, its 1 KiB stripes, its blocks) and on a frame's worth, and on XXH3's known value of
// nothing.
TEST(Wire, TheChecksumIsXxh3WhicheverVectorUnitComputesIt) {
  std::mt19937_64 rng(42);
  std::vector<std::byte> data((4 << 20) + 77);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  EXPECT_EQ(checksum({}), 0x2D06800538D394C2ull);
  for (std::size_t n = 0; n <= 2100; ++n) {
    ASSERT_EQ(checksum({data.data(), n}), checksum_portable({data.data(), n})) << n << " bytes";
  }
  for (std::size_t n : {std::size_t{1} << 16, (std::size_t{1} << 20) + 3, data.size()}) {
    for (std::size_t offset : {0, 1, 7}) {
      const std::span<const std::byte> s(data.data() + offset, n - offset);
      ASSERT_EQ(checksum(s), checksum_portable(s)) << n << " bytes from offset " << offset;
    }
  }
#if defined(__x86_64__)
  const char* unit = __builtin_cpu_supports("avx2") ? "AVX2" : "the library (SSE2)";
#else
  const char* unit = "the library (this CPU's vector unit)";
#endif
  std::cout << "[wire] checksum: XXH3-64 with " << unit << std::endl;
}

// A checksum taken in pieces (as a codec shows a chunk, block by block) is checksum() of the
// whole, with AVX2 where the CPU has it and with the library's build: pieces of every size around
// XXH3's stripes and blocks, an empty piece, one piece, and nothing at all; reset() starts over.
TEST(Wire, AChecksumTakenInPiecesIsTheWholesChecksum) {
  std::mt19937_64 rng(7);
  std::vector<std::byte> data((1 << 20) + 333);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (bool portable : {false, true}) {
    ChecksumStream sum(portable);
    EXPECT_EQ(sum.digest(), checksum({})) << "nothing";
    for (std::size_t piece : {1u, 7u, 64u, 240u, 1000u, 1024u, 8192u, 8193u, 65536u}) {
      for (std::size_t n :
           {std::size_t{0}, std::size_t{100}, std::size_t{8192} * 3 + 5, data.size()}) {
        sum.reset();
        for (std::size_t at = 0; at < n; at += piece) {
          sum.raw({data.data() + at, std::min(piece, n - at)});
          if (at == 0) sum.raw({});  // an empty piece changes nothing
        }
        ASSERT_EQ(sum.digest(), checksum_portable({data.data(), n}))
            << (portable ? "library" : "dispatched") << ", " << n << " bytes in pieces of "
            << piece;
      }
    }
  }
}

}  // namespace
}  // namespace numastream::wire
