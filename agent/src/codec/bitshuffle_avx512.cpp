// The bit-shuffle with AVX-512 (F, BW and VBMI: Ice Lake, Zen 4 and later). Bit planes: the top
// bit of each of 64 bytes is one mask register (vpmovb2m) and a mask back to bytes is one masked
// add; byte planes of 2- and 4-byte elements: byte permutes across the whole register (vpermb,
// vpermt2b). The same bytes as the portable kernel (tests/bitshuffle_test.cpp checks each kernel
// the CPU has against it and against the definition).
// GCC 12's AVX-512 headers make an "undefined" register by initialising a variable with itself,
// which its own -Wmaybe-uninitialized then reports in every caller (GCC bug 105593, fixed in 13).
// x86-64 only: elsewhere this file is empty (kernels_available never offers these kernels).
#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "codec/bitshuffle_kernels.hpp"

namespace numastream::bslz4::detail {
namespace {

#define NUMASTREAM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vbmi")))

// 64 elements at a time: 8 masks of 64 bits, the top bit first (bit 7 of each byte).
NUMASTREAM_AVX512 void planes_to_bits_512(const std::byte* planes, std::byte* out, std::size_t n,
                                          std::size_t e) noexcept {
  const std::size_t plane = n / 8;
  const std::size_t wide = n / 64;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = planes + j * n;
    std::byte* dst = out + 8 * j * plane;
    for (std::size_t q = 0; q < wide; ++q) {
      __m512i v = _mm512_loadu_si512(src + 64 * q);
      for (int k = 7; k >= 0; --k) {
        const std::uint64_t bits = _mm512_movepi8_mask(v);
        std::memcpy(dst + static_cast<std::size_t>(k) * plane + 8 * q, &bits, 8);
        v = _mm512_add_epi8(v, v);
      }
    }
  }
  if (wide * 8 < plane) planes_to_bits(planes, out, n, e, wide * 8, plane);
}

// 64 elements at a time: bit k of each of their bytes is plane k's next 64 bits, added as 1 << k
// where the mask has them.
NUMASTREAM_AVX512 void bits_to_planes_512(const std::byte* in, std::byte* planes, std::size_t n,
                                          std::size_t e) noexcept {
  const std::size_t plane = n / 8;
  const std::size_t wide = n / 64;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = in + 8 * j * plane;
    std::byte* dst = planes + j * n;
    for (std::size_t q = 0; q < wide; ++q) {
      __m512i acc = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        std::uint64_t bits;
        std::memcpy(&bits, src + static_cast<std::size_t>(k) * plane + 8 * q, 8);
        acc = _mm512_mask_add_epi8(acc, bits, acc, _mm512_set1_epi8(static_cast<char>(1 << k)));
      }
      _mm512_storeu_si512(dst + 64 * q, acc);
    }
  }
  if (wide * 8 < plane) bits_to_planes(in, planes, n, e, wide * 8, plane);
}

// Byte indices for vpermb / vpermt2b, built once.
struct Indices {
  alignas(64) std::uint8_t even[64], odd[64];   // 2-byte elements: low, high bytes of 64
  alignas(64) std::uint8_t lo2[64], hi2[64];    // and back: elements 0-31, 32-63
  alignas(64) std::uint8_t by4[64], from4[64];  // 4-byte elements: 16 by plane, and back
  Indices() noexcept {
    for (int i = 0; i < 64; ++i) {
      even[i] = static_cast<std::uint8_t>(2 * i);
      odd[i] = static_cast<std::uint8_t>(2 * i + 1);
      // Output byte i is element i / 2 (of 32), its low byte (plane 0) or its high (plane 1:
      // the second register, indices from 64).
      lo2[i] = static_cast<std::uint8_t>(i / 2 + (i % 2 ? 64 : 0));
      hi2[i] = static_cast<std::uint8_t>(32 + i / 2 + (i % 2 ? 64 : 0));
      // Lane p of 16 bytes holds byte p of elements 0..15: by4[16p + i] = 4i + p.
      by4[i] = static_cast<std::uint8_t>(4 * (i % 16) + i / 16);
      // Back: byte p of element i (at 4i + p) is at 16p + i.
      from4[i] = static_cast<std::uint8_t>(16 * (i % 4) + i / 4);
    }
  }
};
const Indices& indices() noexcept {
  static const Indices ix;
  return ix;
}

// A 4x4 transpose of 128-bit lanes: lane p of register a goes to lane a of register p.
NUMASTREAM_AVX512 inline void transpose_lanes(__m512i& r0, __m512i& r1, __m512i& r2,
                                              __m512i& r3) noexcept {
  const __m512i t0 = _mm512_shuffle_i64x2(r0, r1, 0x44), t1 = _mm512_shuffle_i64x2(r0, r1, 0xEE);
  const __m512i t2 = _mm512_shuffle_i64x2(r2, r3, 0x44), t3 = _mm512_shuffle_i64x2(r2, r3, 0xEE);
  r0 = _mm512_shuffle_i64x2(t0, t2, 0x88);
  r1 = _mm512_shuffle_i64x2(t0, t2, 0xDD);
  r2 = _mm512_shuffle_i64x2(t1, t3, 0x88);
  r3 = _mm512_shuffle_i64x2(t1, t3, 0xDD);
}

// Byte planes; returns the elements done (a multiple of 64; the rest is the portable kernel's).
NUMASTREAM_AVX512 std::size_t bytes_to_planes_512(const std::byte* in, std::byte* planes,
                                                  std::size_t n, std::size_t e) noexcept {
  const Indices& ix = indices();
  const std::size_t wide = n / 64;
  if (e == 2) {
    const __m512i even = _mm512_load_si512(ix.even), odd = _mm512_load_si512(ix.odd);
    for (std::size_t q = 0; q < wide; ++q) {
      const __m512i a = _mm512_loadu_si512(in + 128 * q), b = _mm512_loadu_si512(in + 128 * q + 64);
      _mm512_storeu_si512(planes + 64 * q, _mm512_permutex2var_epi8(a, even, b));
      _mm512_storeu_si512(planes + n + 64 * q, _mm512_permutex2var_epi8(a, odd, b));
    }
    return wide * 64;
  }
  if (e == 4) {
    const __m512i by4 = _mm512_load_si512(ix.by4);
    for (std::size_t q = 0; q < wide; ++q) {
      const std::byte* src = in + 256 * q;
      __m512i r0 = _mm512_permutexvar_epi8(by4, _mm512_loadu_si512(src));
      __m512i r1 = _mm512_permutexvar_epi8(by4, _mm512_loadu_si512(src + 64));
      __m512i r2 = _mm512_permutexvar_epi8(by4, _mm512_loadu_si512(src + 128));
      __m512i r3 = _mm512_permutexvar_epi8(by4, _mm512_loadu_si512(src + 192));
      transpose_lanes(r0, r1, r2, r3);
      _mm512_storeu_si512(planes + 64 * q, r0);
      _mm512_storeu_si512(planes + n + 64 * q, r1);
      _mm512_storeu_si512(planes + 2 * n + 64 * q, r2);
      _mm512_storeu_si512(planes + 3 * n + 64 * q, r3);
    }
    return wide * 64;
  }
  return 0;
}

NUMASTREAM_AVX512 std::size_t planes_to_bytes_512(const std::byte* planes, std::byte* out,
                                                  std::size_t n, std::size_t e) noexcept {
  const Indices& ix = indices();
  const std::size_t wide = n / 64;
  if (e == 2) {
    const __m512i lo2 = _mm512_load_si512(ix.lo2), hi2 = _mm512_load_si512(ix.hi2);
    for (std::size_t q = 0; q < wide; ++q) {
      const __m512i l = _mm512_loadu_si512(planes + 64 * q);
      const __m512i h = _mm512_loadu_si512(planes + n + 64 * q);
      _mm512_storeu_si512(out + 128 * q, _mm512_permutex2var_epi8(l, lo2, h));
      _mm512_storeu_si512(out + 128 * q + 64, _mm512_permutex2var_epi8(l, hi2, h));
    }
    return wide * 64;
  }
  if (e == 4) {
    const __m512i from4 = _mm512_load_si512(ix.from4);
    for (std::size_t q = 0; q < wide; ++q) {
      __m512i r0 = _mm512_loadu_si512(planes + 64 * q);
      __m512i r1 = _mm512_loadu_si512(planes + n + 64 * q);
      __m512i r2 = _mm512_loadu_si512(planes + 2 * n + 64 * q);
      __m512i r3 = _mm512_loadu_si512(planes + 3 * n + 64 * q);
      transpose_lanes(r0, r1, r2, r3);
      std::byte* dst = out + 256 * q;
      _mm512_storeu_si512(dst, _mm512_permutexvar_epi8(from4, r0));
      _mm512_storeu_si512(dst + 64, _mm512_permutexvar_epi8(from4, r1));
      _mm512_storeu_si512(dst + 128, _mm512_permutexvar_epi8(from4, r2));
      _mm512_storeu_si512(dst + 192, _mm512_permutexvar_epi8(from4, r3));
    }
    return wide * 64;
  }
  return 0;
}

#undef NUMASTREAM_AVX512
#define NUMASTREAM_GFNI __attribute__((target("avx512f,avx512bw,avx512vbmi,gfni")))

// With GFNI one instruction transposes the 8x8 bit matrix of each 64-bit lane: an affine
// transformation whose matrix is the data (gf2p8affineqb computes bit k of its result byte from
// the matrix's byte 7 - k), applied to the bytes 1 << i, after the lane's bytes are reversed.
// Around it, vpermb moves whole bytes between the lanes: 64 elements of a byte plane at a time.
struct GfniIndices {
  alignas(64) std::uint8_t reverse[64];          // the bytes of each lane in reverse order
  alignas(64) std::uint8_t across[64];           // byte m of lane k <-> byte k of lane m
  alignas(64) std::uint8_t across_reversed[64];  // across, then each lane reversed
  GfniIndices() noexcept {
    for (int i = 0; i < 64; ++i) {
      const int lane = i / 8, b = i % 8;
      reverse[i] = static_cast<std::uint8_t>(8 * lane + 7 - b);
      across[i] = static_cast<std::uint8_t>(8 * b + lane);
      across_reversed[i] = static_cast<std::uint8_t>(8 * (7 - b) + lane);
    }
  }
};
const GfniIndices& gfni_indices() noexcept {
  static const GfniIndices ix;
  return ix;
}
constexpr long long kBitsOneByOne = 0x8040201008040201LL;  // lane bytes 1 << i

// 8 bytes at p and 8 at p + stride as one register; and back (unaligned 64-bit moves).
NUMASTREAM_GFNI inline __m128i load_pair(const std::byte* p, std::size_t stride) noexcept {
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + stride)));
}
NUMASTREAM_GFNI inline void store_pair(std::byte* p, std::size_t stride, __m128i v) noexcept {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), v);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p + stride), _mm_unpackhi_epi64(v, v));
}

NUMASTREAM_GFNI void planes_to_bits_gfni(const std::byte* planes, std::byte* out, std::size_t n,
                                         std::size_t e) noexcept {
  const GfniIndices& ix = gfni_indices();
  const __m512i reverse = _mm512_load_si512(ix.reverse), across = _mm512_load_si512(ix.across);
  const __m512i bits = _mm512_set1_epi64(kBitsOneByOne);
  const std::size_t plane = n / 8;
  const std::size_t wide = n / 64;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = planes + j * n;
    std::byte* dst = out + 8 * j * plane;
    for (std::size_t q = 0; q < wide; ++q) {
      // Lane m: byte j of elements 8m..8m+7; transposed, byte k: their bit k; across, lane k:
      // the 8 bytes of bit plane k for these 64 elements.
      const __m512i v = _mm512_permutexvar_epi8(reverse, _mm512_loadu_si512(src + 64 * q));
      const __m512i t = _mm512_permutexvar_epi8(across, _mm512_gf2p8affine_epi64_epi8(bits, v, 0));
      std::byte* d = dst + 8 * q;
      store_pair(d, plane, _mm512_extracti32x4_epi32(t, 0));
      store_pair(d + 2 * plane, plane, _mm512_extracti32x4_epi32(t, 1));
      store_pair(d + 4 * plane, plane, _mm512_extracti32x4_epi32(t, 2));
      store_pair(d + 6 * plane, plane, _mm512_extracti32x4_epi32(t, 3));
    }
  }
  if (wide * 8 < plane) planes_to_bits(planes, out, n, e, wide * 8, plane);
}

NUMASTREAM_GFNI void bits_to_planes_gfni(const std::byte* in, std::byte* planes, std::size_t n,
                                         std::size_t e) noexcept {
  const GfniIndices& ix = gfni_indices();
  const __m512i across_reversed = _mm512_load_si512(ix.across_reversed);
  const __m512i bits = _mm512_set1_epi64(kBitsOneByOne);
  const std::size_t plane = n / 8;
  const std::size_t wide = n / 64;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = in + 8 * j * plane;
    std::byte* dst = planes + j * n;
    for (std::size_t q = 0; q < wide; ++q) {
      // Lane k: 8 bytes of bit plane k; across (and reversed for the transpose), lane m: byte m
      // of each plane; transposed, byte b: byte j of element 8m + b.
      const std::byte* s = src + 8 * q;
      __m512i v = _mm512_castsi128_si512(load_pair(s, plane));
      v = _mm512_inserti32x4(v, load_pair(s + 2 * plane, plane), 1);
      v = _mm512_inserti32x4(v, load_pair(s + 4 * plane, plane), 2);
      v = _mm512_inserti32x4(v, load_pair(s + 6 * plane, plane), 3);
      const __m512i t = _mm512_permutexvar_epi8(across_reversed, v);
      _mm512_storeu_si512(dst + 64 * q, _mm512_gf2p8affine_epi64_epi8(bits, t, 0));
    }
  }
  if (wide * 8 < plane) bits_to_planes(in, planes, n, e, wide * 8, plane);
}

#undef NUMASTREAM_GFNI

}  // namespace

void shuffle_bits_avx512(const std::byte* in, std::byte* out, std::size_t n, std::size_t e,
                         bool gfni) noexcept {
  const std::byte* planes = in;
  if (e > 1) {
    std::byte* tmp = plane_scratch(n * e);
    bytes_to_planes(in, tmp, n, e, bytes_to_planes_512(in, tmp, n, e));
    planes = tmp;
  }
  if (gfni) return planes_to_bits_gfni(planes, out, n, e);
  planes_to_bits_512(planes, out, n, e);
}

void unshuffle_bits_avx512(const std::byte* in, std::byte* out, std::size_t n, std::size_t e,
                           bool gfni) noexcept {
  auto bits_to = gfni ? bits_to_planes_gfni : bits_to_planes_512;
  if (e == 1) return bits_to(in, out, n, e);
  std::byte* tmp = plane_scratch(n * e);
  bits_to(in, tmp, n, e);
  planes_to_bytes(tmp, out, n, e, planes_to_bytes_512(tmp, out, n, e));
}

}  // namespace numastream::bslz4::detail

#endif  // __x86_64__
