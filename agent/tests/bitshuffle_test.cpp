#include "codec/bitshuffle.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codec/synth.hpp"

namespace numastream::bslz4 {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

// A 16-bit detector-like frame (the benchmarks' projections).
std::vector<std::byte> projection(std::size_t bytes) {
  SynthParams p;
  p.chunk_bytes = bytes;
  p.width = 256;
  std::vector<std::byte> v(bytes);
  generate_projection(p, 0, v);
  return v;
}

// The definition, one bit at a time: plane p (bit p of the little-endian element), bit i of the
// plane at bit i % 8 of its byte i / 8.
std::vector<std::byte> shuffle_by_definition(const std::vector<std::byte>& in, std::size_t e) {
  const std::size_t n = in.size() / e;
  std::vector<std::byte> out(in.size());
  for (std::size_t p = 0; p < 8 * e; ++p) {
    for (std::size_t i = 0; i < n; ++i) {
      unsigned bit = (std::to_integer<unsigned>(in[i * e + p / 8]) >> (p % 8)) & 1u;
      out[p * (n / 8) + i / 8] |= static_cast<std::byte>(bit << (i % 8));
    }
  }
  return out;
}

// Every kernel this CPU runs, on every element size and on lengths that are and are not whole
// vectors (64 and 256 elements) of each: the bytes of the definition, and back.
TEST(Bitshuffle, EveryKernelThisCpuRunsFollowsTheDefinition) {
  for (const Kernel k : kernels_available()) {
    for (std::size_t e : {1u, 2u, 3u, 4u, 8u}) {
      for (std::size_t n : {8u, 24u, 32u, 40u, 64u, 72u, 248u, 256u, 264u, 4096u, 4104u}) {
        auto in = random_bytes(n * e, static_cast<unsigned>(n + e));
        auto want = shuffle_by_definition(in, e);
        std::vector<std::byte> a(in.size()), back(in.size());
        shuffle_bits(in.data(), a.data(), n, e, k);
        EXPECT_EQ(a, want) << kernel_name(k) << " kernel, e=" << e << " n=" << n;
        unshuffle_bits(a.data(), back.data(), n, e, k);
        EXPECT_EQ(back, in) << kernel_name(k) << " kernel back, e=" << e << " n=" << n;
      }
    }
  }
}

// The kernels a CPU gets, read against what the kernel says the CPU has (/proc/cpuinfo's flags,
// not the compiler's CPU check the dispatch uses): AVX2 where it has avx2, AVX-512 where it has
// avx512f, avx512bw and avx512vbmi, with GFNI where it also has gfni; the dispatch takes the
// best, or the one a cap names. Other CPUs than x86-64 get the portable kernel alone.
TEST(Bitshuffle, TheDispatchTakesTheBestKernelTheCpuHas) {
#if !defined(__x86_64__)
  EXPECT_EQ(kernels_available(), std::vector<Kernel>{Kernel::portable});
  for (const char* cap : {"", "avx2", "avx512", "portable"})
    EXPECT_EQ(choose_kernel(cap), Kernel::portable) << cap;
  EXPECT_EQ(kernel_in_use(), Kernel::portable);
  std::printf("this CPU's bslz4 kernels: portable\n");
  return;
#endif
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  auto has = [&](const std::string& f) { return flags.find(" " + f + " ") != std::string::npos; };
  std::vector<Kernel> want = {Kernel::portable};
  if (has("avx2")) want.push_back(Kernel::avx2);
  if (has("avx512f") && has("avx512bw") && has("avx512vbmi")) {
    want.push_back(Kernel::avx512);
    if (has("gfni")) want.push_back(Kernel::avx512_gfni);
  }
  EXPECT_EQ(kernels_available(), want);
  std::printf("this CPU's bslz4 kernels:");
  for (const Kernel k : want) std::printf(" %s", kernel_name(k));
  std::printf("\n");
  EXPECT_EQ(choose_kernel(nullptr), want.back());
  EXPECT_EQ(choose_kernel(""), want.back());
  EXPECT_EQ(choose_kernel("no-such-kernel"), want.back());
  EXPECT_EQ(choose_kernel("portable"), Kernel::portable);
  for (const Kernel k : want) EXPECT_EQ(choose_kernel(kernel_name(k)), k);
  if (!has("avx512vbmi")) {
    EXPECT_EQ(choose_kernel("avx512"), want.back());
  }
  EXPECT_EQ(kernel_in_use(), choose_kernel(std::getenv("NUMASTREAM_BSLZ4_KERNEL")));
}

TEST(Bitshuffle, DefaultBlocksAreTheReferenceLibrarys) {
  EXPECT_EQ(default_block_elements(1), 8192u);
  EXPECT_EQ(default_block_elements(2), 4096u);
  EXPECT_EQ(default_block_elements(4), 2048u);
  EXPECT_EQ(default_block_elements(3), 2728u);
  EXPECT_EQ(default_block_elements(128), 128u);
}

TEST(Bitshuffle, RoundTripsEveryShapeOfInput) {
  Workspace ws;
  // Whole blocks, a partial last block, a tail of fewer than 8 elements, less than one group.
  for (std::size_t e : {1u, 2u, 4u, 8u}) {
    for (std::size_t n : {0u, 3u, 8u, 1000u, 4096u, 4099u, 3 * 4096u + 13, 100000u}) {
      auto raw = e == 2 ? projection(n * e) : random_bytes(n * e, 7);
      std::vector<std::byte> enc(max_encoded_size(raw.size()));
      std::size_t size = ws.encode(raw, e, enc);
      ASSERT_LE(size, enc.size());
      std::span<const std::byte> framed(enc.data(), size);
      EXPECT_TRUE(check_framing(framed, e, raw.size())) << "e=" << e << " n=" << n;
      std::vector<std::byte> out(raw.size());
      ASSERT_TRUE(ws.decode(framed, e, out)) << "e=" << e << " n=" << n;
      EXPECT_EQ(out, raw) << "e=" << e << " n=" << n;
    }
  }
}

// What encode and decode show of the raw bytes as they work (a chunk's checksum is taken from
// it): every byte once, in order, whatever the shape of the input.
TEST(Bitshuffle, EncodeAndDecodeShowEveryRawByteOnceInOrder) {
  struct Pieces final : RawObserver {
    std::vector<std::byte> seen;
    int pieces = 0;
    void raw(std::span<const std::byte> p) noexcept override {
      seen.insert(seen.end(), p.begin(), p.end());
      ++pieces;
    }
  };
  Workspace ws;
  for (std::size_t e : {1u, 2u, 4u, 8u}) {
    for (std::size_t n : {0u, 3u, 8u, 4096u, 4099u, 3 * 4096u + 13, 100000u}) {
      const auto raw = random_bytes(n * e, 11);
      std::vector<std::byte> enc(max_encoded_size(raw.size()));
      Pieces in, out;
      const std::size_t size = ws.encode(raw, e, enc, 0, &in);
      EXPECT_EQ(in.seen, raw) << "encode, e=" << e << " n=" << n;
      std::vector<std::byte> back(raw.size());
      ASSERT_TRUE(ws.decode({enc.data(), size}, e, back, &out)) << "e=" << e << " n=" << n;
      EXPECT_EQ(out.seen, raw) << "decode, e=" << e << " n=" << n;
      if (n * e > 3 * 8192) {
        EXPECT_GT(out.pieces, 2) << "shown block by block";
      }
    }
  }
}

TEST(Bitshuffle, FramingIsTheHdf5Filters) {
  Workspace ws;
  auto raw = projection(2 * 10000);  // 10000 16-bit samples: 2 blocks of 4096, 1808, no tail
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  std::size_t size = ws.encode(raw, 2, enc);
  auto be = [&](std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v = (v << 8) | std::to_integer<unsigned>(enc[at + static_cast<std::size_t>(i)]);
    return v;
  };
  EXPECT_EQ(be(0, 8), raw.size());
  EXPECT_EQ(be(8, 4), 4096u * 2);
  std::size_t pos = 12, blocks = 0;
  while (pos < size) {
    pos += 4 + be(pos, 4);
    ++blocks;
  }
  EXPECT_EQ(pos, size);
  EXPECT_EQ(blocks, 3u);
  // Detector data shuffled by bit compresses far better than by byte.
  EXPECT_LT(size, raw.size() / 3) << "bslz4 on a projection";
}

TEST(Bitshuffle, MalformedInputIsRefusedNeverOverrun) {
  Workspace ws;
  auto raw = projection(2 * 9000 + 6);  // with a 3-element tail
  std::vector<std::byte> enc(max_encoded_size(raw.size()));
  std::size_t size = ws.encode(raw, 2, enc);
  std::vector<std::byte> good(enc.begin(), enc.begin() + static_cast<std::ptrdiff_t>(size));
  std::vector<std::byte> out(raw.size());
  ASSERT_TRUE(ws.decode(good, 2, out));

  auto refused = [&](std::vector<std::byte> bad, const char* what, std::size_t e = 2) {
    std::vector<std::byte> o(raw.size());
    EXPECT_FALSE(ws.decode(bad, e, o)) << what;
    EXPECT_FALSE(check_framing(bad, e, raw.size())) << what;
  };
  refused({good.begin(), good.begin() + 11}, "shorter than the header");
  refused({good.begin(), good.end() - 1}, "a byte of the tail missing");
  auto longer = good;
  longer.push_back(std::byte{0});
  refused(longer, "a byte too many");
  auto wrong_total = good;
  wrong_total[7] = static_cast<std::byte>(std::to_integer<unsigned>(wrong_total[7]) ^ 2);
  refused(wrong_total, "a raw size that is not the chunk's");
  auto zero_block = good;
  zero_block[8] = zero_block[9] = zero_block[10] = zero_block[11] = std::byte{0};
  refused(zero_block, "block size 0");
  auto odd_block = good;
  odd_block[11] = std::byte{6};
  refused(odd_block, "a block size that is not a multiple of 8 elements");
  auto long_length = good;
  long_length[12] = std::byte{0x7f};
  refused(long_length, "a block length past the end");
  auto damaged = good;
  damaged[20] = static_cast<std::byte>(std::to_integer<unsigned>(damaged[20]) ^ 0xff);
  std::vector<std::byte> o(raw.size());
  // Damaged LZ4 data inside a well-formed framing: the structure checks out, decoding either
  // fails or gives other bytes (the checksum catches those); never out of bounds.
  EXPECT_TRUE(check_framing(damaged, 2, raw.size()));
  if (ws.decode(damaged, 2, o)) {
    EXPECT_NE(o, raw);
  }
  std::vector<std::byte> wrong_size(raw.size() - 2);
  EXPECT_FALSE(ws.decode(good, 2, wrong_size)) << "output of another size";
  refused(good, "element size 4 for 2-byte data is a different raw size split", 4);
}

}  // namespace
}  // namespace numastream::bslz4
