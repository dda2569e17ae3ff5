#include "codec/synth.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "codec/codec.hpp"

namespace numastream {
namespace {

std::vector<std::byte> make(const SynthParams& p, int frame) {
  std::vector<std::byte> v(p.chunk_bytes);
  generate_projection(p, frame, v);
  return v;
}

TEST(Synth, DeterministicFromTheSeed) {
  SynthParams p;
  p.chunk_bytes = 2560 * 64 * 2;
  EXPECT_EQ(make(p, 1), make(p, 1));
  SynthParams q = p;
  q.seed = 2;
  EXPECT_NE(make(p, 1), make(q, 1));
  EXPECT_NE(make(p, 0), make(p, 1)) << "projections differ as the sample rotates";
}

// The paper's data: a full 2560x2160 16-bit projection, plain LZ4 near 2:1 from photon noise
// rather than from zero runs.
TEST(Synth, FullProjectionCompressesNearTwoToOneWithoutZeroRuns) {
  SynthParams p;
  ASSERT_EQ(p.chunk_bytes, 11059200u);
  auto raw = make(p, 0);
  Compressor c(Codec::lz4, 1, raw.size());
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  double ratio = static_cast<double>(raw.size()) / static_cast<double>(c.compress(raw, enc).size);
  EXPECT_GT(ratio, 1.7);
  EXPECT_LT(ratio, 2.4);
  // Mostly non-zero pixels: the open beam counts ~30 photons.
  const auto* px = reinterpret_cast<const std::uint16_t*>(raw.data());
  std::size_t zeros = std::count(px, px + raw.size() / 2, 0);
  EXPECT_LT(static_cast<double>(zeros) / (raw.size() / 2.0), 0.1);
  // Longest run of identical pixels stays short.
  std::size_t longest = 0, run = 1;
  for (std::size_t i = 1; i < raw.size() / 2; ++i) {
    run = px[i] == px[i - 1] ? run + 1 : 1;
    longest = std::max(longest, run);
  }
  EXPECT_LT(longest, 64u);
}

double lz4_ratio(const std::vector<std::byte>& raw) {
  Compressor c(Codec::lz4, 1, raw.size());
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  return static_cast<double>(raw.size()) / static_cast<double>(c.compress(raw, enc).size);
}

// The benchmarks' tomography-like set (more photons through a denser sample): still near 2:1, but
// less compressible than the default, and brighter where the beam is open.
TEST(Synth, MorePhotonsThroughADenserSampleCompressLess) {
  SynthParams plain;
  plain.chunk_bytes = 2560 * 256 * 2;
  SynthParams dense = plain;
  dense.flat_field = 16;
  dense.attenuation = 2.5;
  const auto a = make(plain, 0), b = make(dense, 0);
  EXPECT_LT(lz4_ratio(b), lz4_ratio(a));
  EXPECT_GT(lz4_ratio(b), 1.7);
  // The first column is outside the sample: the open beam's counts.
  auto mean_edge = [](const std::vector<std::byte>& raw) {
    const auto* px = reinterpret_cast<const std::uint16_t*>(raw.data());
    double sum = 0;
    for (std::size_t y = 0; y < 256; ++y) sum += px[y * 2560];
    return sum / 256;
  };
  EXPECT_NEAR(mean_edge(a), 10, 1.5);
  EXPECT_NEAR(mean_edge(b), 16, 1.5);
}

TEST(Synth, AnyChunkSizeIncludingOdd) {
  SynthParams p;
  p.chunk_bytes = 12345;
  auto v = make(p, 0);
  EXPECT_EQ(v.size(), 12345u);
}

}  // namespace
}  // namespace numastream
