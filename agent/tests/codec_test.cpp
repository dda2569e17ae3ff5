#include "codec/codec.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "codec/synth.hpp"

namespace numastream {
namespace {

std::vector<std::byte> projection(std::size_t bytes) {
  SynthParams p;
  p.chunk_bytes = bytes;
  p.width = 512;
  std::vector<std::byte> v(bytes);
  generate_projection(p, 0, v);
  return v;
}

std::vector<std::byte> roundtrip(Codec codec, const std::vector<std::byte>& raw,
                                 Codec* used = nullptr, std::size_t* encoded = nullptr) {
  Compressor c(codec, 1, raw.size());
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  auto r = c.compress(raw, enc);
  if (used) *used = r.codec;
  if (encoded) *encoded = r.size;
  Decompressor d(raw.size());
  std::vector<std::byte> out(raw.size());
  EXPECT_TRUE(d.decompress(r.codec, {enc.data(), r.size}, out, 2));
  return out;
}

TEST(Codec, NamesRoundTrip) {
  for (Codec c : {Codec::none, Codec::lz4, Codec::shuffle_lz4, Codec::bslz4}) {
    EXPECT_EQ(parse_codec(codec_name(c)), c);
  }
  EXPECT_FALSE(parse_codec("zstd"));
  EXPECT_TRUE(codec_known(3));
  EXPECT_FALSE(codec_known(4));
}

TEST(Codec, EveryCodecRoundTripsAProjection) {
  auto raw = projection(512 * 100 * 2);
  for (Codec c : {Codec::none, Codec::lz4, Codec::shuffle_lz4, Codec::bslz4}) {
    Codec used;
    std::size_t size;
    EXPECT_EQ(roundtrip(c, raw, &used, &size), raw) << codec_name(c);
    if (c != Codec::none) {
      EXPECT_EQ(used, c);
      EXPECT_LT(size, raw.size() * 3 / 4) << codec_name(c) << " should compress detector data";
    }
  }
}

// Every codec shows the compressor and the decompressor every raw byte once, in order (the
// chunk's checksum is taken from what they show): bslz4 block by block, the others in one piece;
// an incompressible chunk and a bslz4 one of a length that is no whole number of samples too.
TEST(Codec, EveryCodecShowsEveryRawByteOnce) {
  struct Pieces final : RawObserver {
    std::vector<std::byte> seen;
    void raw(std::span<const std::byte> p) noexcept override {
      seen.insert(seen.end(), p.begin(), p.end());
    }
  };
  std::vector<std::byte> noise(70001);
  std::mt19937_64 rng(3);
  for (auto& b : noise) b = static_cast<std::byte>(rng());
  for (const auto& raw : {projection(512 * 100 * 2), noise}) {
    for (Codec codec : {Codec::none, Codec::lz4, Codec::shuffle_lz4, Codec::bslz4}) {
      Compressor c(codec, 1, raw.size(), 2);
      std::vector<std::byte> enc(max_encoded_size(raw.size()));
      Pieces in, out;
      const auto r = c.compress(raw, enc, &in);
      EXPECT_EQ(in.seen, raw) << codec_name(codec) << " compressing " << raw.size() << " bytes";
      Decompressor d(raw.size());
      std::vector<std::byte> back(raw.size());
      ASSERT_TRUE(d.decompress(r.codec, {enc.data(), r.size}, back, 2, &out));
      EXPECT_EQ(out.seen, raw) << codec_name(codec) << " decompressing " << raw.size() << " bytes";
    }
  }
}

TEST(Codec, EmptyChunk) {
  std::vector<std::byte> empty;
  Codec used;
  EXPECT_EQ(roundtrip(Codec::lz4, empty, &used), empty);
  EXPECT_EQ(used, Codec::none);
}

TEST(Codec, IncompressibleChunkIsShippedRaw) {
  std::vector<std::byte> raw(100000);
  std::mt19937_64 rng(7);
  for (auto& b : raw) b = static_cast<std::byte>(rng());
  Codec used;
  std::size_t size;
  EXPECT_EQ(roundtrip(Codec::lz4, raw, &used, &size), raw);
  EXPECT_EQ(used, Codec::none);
  EXPECT_EQ(size, raw.size());
}

TEST(Codec, ShuffleHandlesOddLengths) {
  std::vector<std::byte> raw(1001);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::byte>(i % 7);
  std::vector<std::byte> shuffled(raw.size()), back(raw.size());
  shuffle16(raw.data(), shuffled.data(), raw.size());
  EXPECT_EQ(shuffled[0], raw[0]);
  EXPECT_EQ(shuffled[500], raw[1]) << "high bytes follow the 500 low bytes";
  EXPECT_EQ(shuffled[1000], raw[1000]);
  unshuffle16(shuffled.data(), back.data(), raw.size());
  EXPECT_EQ(back, raw);
  EXPECT_EQ(roundtrip(Codec::shuffle_lz4, raw), raw);
}

TEST(Codec, DecompressorRejectsDamagedAndMisSizedInput) {
  auto raw = projection(512 * 40 * 2);
  Compressor c(Codec::lz4, 1, raw.size());
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  auto r = c.compress(raw, enc);
  Decompressor d(raw.size());
  std::vector<std::byte> out(raw.size());
  // Truncated input.
  EXPECT_FALSE(d.decompress(Codec::lz4, {enc.data(), r.size / 2}, out));
  // Claims a raw size smaller than the data decodes to.
  std::vector<std::byte> small(raw.size() - 10);
  EXPECT_FALSE(d.decompress(Codec::lz4, {enc.data(), r.size}, small));
  // Garbage.
  std::vector<std::byte> junk(r.size, std::byte{0xff});
  EXPECT_FALSE(d.decompress(Codec::lz4, junk, out));
  // `none` with a size that lies.
  EXPECT_FALSE(d.decompress(Codec::none, {raw.data(), raw.size() - 1}, out));
  // Larger than the decompressor was built for.
  std::vector<std::byte> huge(raw.size() + 1);
  EXPECT_FALSE(d.decompress(Codec::none, huge, huge));
}

TEST(Codec, AccelerationTradesRatioForSpeed) {
  auto raw = projection(512 * 200 * 2);
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  Compressor fast(Codec::lz4, 64, raw.size());
  Compressor normal(Codec::lz4, 1, raw.size());
  EXPECT_GE(fast.compress(raw, enc).size, normal.compress(raw, enc).size);
}

}  // namespace
}  // namespace numastream
