#include "codec/bitshuffle.hpp"

#include <lz4.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "codec/bitshuffle_kernels.hpp"

namespace numastream::bslz4 {
namespace {

constexpr std::size_t kTargetBlockBytes = 8192;
constexpr std::size_t kBlockMultiple = 8;
constexpr std::size_t kMinBlockElements = 128;

void put_be(std::byte* p, std::uint64_t v, int bytes) noexcept {
  for (int i = 0; i < bytes; ++i)
    p[i] = static_cast<std::byte>((v >> (8 * (bytes - 1 - i))) & 0xff);
}

std::uint64_t get_be(const std::byte* p, int bytes) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | std::to_integer<std::uint8_t>(p[i]);
  return v;
}

// Transposes an 8x8 bit matrix held in a little-endian u64 (byte r = row r): afterwards byte k
// holds bit k of every original byte, byte b's bit at position b. Its own inverse.
inline std::uint64_t transpose8x8(std::uint64_t x) noexcept {
  std::uint64_t t;
  t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
  x = x ^ t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
  x = x ^ t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
  x = x ^ t ^ (t << 28);
  return x;
}

}  // namespace

namespace detail {

// Bit planes of byte planes: `planes` holds e planes of n bytes (byte j of every element);
// groups [m0, m1) of 8 elements are written. The portable kernel of both directions.
void planes_to_bits(const std::byte* planes, std::byte* out, std::size_t n, std::size_t e,
                    std::size_t m0, std::size_t m1) noexcept {
  const std::size_t plane = n / 8;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = planes + j * n;
    std::byte* dst = out + 8 * j * plane;
    for (std::size_t m = m0; m < m1; ++m) {
      std::uint64_t x;
      std::memcpy(&x, src + 8 * m, 8);
      x = transpose8x8(x);
      for (std::size_t k = 0; k < 8; ++k) dst[k * plane + m] = static_cast<std::byte>(x >> (8 * k));
    }
  }
}

void bits_to_planes(const std::byte* in, std::byte* planes, std::size_t n, std::size_t e,
                    std::size_t m0, std::size_t m1) noexcept {
  const std::size_t plane = n / 8;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = in + 8 * j * plane;
    std::byte* dst = planes + j * n;
    for (std::size_t m = m0; m < m1; ++m) {
      std::uint64_t x = 0;
      for (std::size_t k = 0; k < 8; ++k) {
        x |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(src[k * plane + m]))
             << (8 * k);
      }
      x = transpose8x8(x);
      std::memcpy(dst + 8 * m, &x, 8);
    }
  }
}

namespace {

template <std::size_t E>
void bytes_to_planes_t(const std::byte* in, std::byte* planes, std::size_t n,
                       std::size_t i0) noexcept {
  for (std::size_t i = i0; i < n; ++i) {
    for (std::size_t j = 0; j < E; ++j) planes[j * n + i] = in[i * E + j];
  }
}

template <std::size_t E>
void planes_to_bytes_t(const std::byte* planes, std::byte* out, std::size_t n,
                       std::size_t i0) noexcept {
  for (std::size_t i = i0; i < n; ++i) {
    for (std::size_t j = 0; j < E; ++j) out[i * E + j] = planes[j * n + i];
  }
}

}  // namespace

void bytes_to_planes(const std::byte* in, std::byte* planes, std::size_t n, std::size_t e,
                     std::size_t i0) noexcept {
  switch (e) {
    case 2:
      return bytes_to_planes_t<2>(in, planes, n, i0);
    case 4:
      return bytes_to_planes_t<4>(in, planes, n, i0);
    case 8:
      return bytes_to_planes_t<8>(in, planes, n, i0);
    default:
      for (std::size_t i = i0; i < n; ++i) {
        for (std::size_t j = 0; j < e; ++j) planes[j * n + i] = in[i * e + j];
      }
  }
}

void planes_to_bytes(const std::byte* planes, std::byte* out, std::size_t n, std::size_t e,
                     std::size_t i0) noexcept {
  switch (e) {
    case 2:
      return planes_to_bytes_t<2>(planes, out, n, i0);
    case 4:
      return planes_to_bytes_t<4>(planes, out, n, i0);
    case 8:
      return planes_to_bytes_t<8>(planes, out, n, i0);
    default:
      for (std::size_t i = i0; i < n; ++i) {
        for (std::size_t j = 0; j < e; ++j) out[i * e + j] = planes[j * n + i];
      }
  }
}

// Byte planes go through a thread-local scratch (elements of one byte need none).
std::byte* plane_scratch(std::size_t bytes) {
  thread_local std::unique_ptr<std::byte[]> buf;
  thread_local std::size_t cap = 0;
  if (cap < bytes) {
    buf = std::make_unique<std::byte[]>(bytes);
    cap = bytes;
  }
  return buf.get();
}

}  // namespace detail

namespace {

using detail::bits_to_planes;
using detail::bytes_to_planes;
using detail::plane_scratch;
using detail::planes_to_bits;
using detail::planes_to_bytes;

// x86-64 only: the vector kernels (other CPUs run the portable one).
#if defined(__x86_64__)
// AVX2: the top bit of each of 32 bytes is one movemask; shifting the bytes left walks the bits.
__attribute__((target("avx2"))) void planes_to_bits_avx2(const std::byte* planes, std::byte* out,
                                                         std::size_t n, std::size_t e) noexcept {
  const std::size_t plane = n / 8;
  const std::size_t wide = n / 32;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = planes + j * n;
    std::byte* dst = out + 8 * j * plane;
    for (std::size_t q = 0; q < wide; ++q) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * q));
      for (int k = 7; k >= 0; --k) {
        auto bits = static_cast<std::uint32_t>(_mm256_movemask_epi8(v));
        std::memcpy(dst + static_cast<std::size_t>(k) * plane + 4 * q, &bits, 4);
        v = _mm256_add_epi8(v, v);
      }
    }
  }
  if (wide * 4 < plane) planes_to_bits(planes, out, n, e, wide * 4, plane);
}

// transpose8x8 on each 64-bit lane.
__attribute__((target("avx2"))) inline __m256i transpose8x8_avx2(__m256i x) noexcept {
  const __m256i m1 = _mm256_set1_epi64x(0x00AA00AA00AA00AALL);
  const __m256i m2 = _mm256_set1_epi64x(0x0000CCCC0000CCCCLL);
  const __m256i m3 = _mm256_set1_epi64x(0x00000000F0F0F0F0LL);
  __m256i t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 7)), m1);
  x = _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 7));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 14)), m2);
  x = _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 14));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 28)), m3);
  return _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 28));
}

// 256 elements at a time: the 32 bytes at the same place of the 8 bit planes of a byte plane are
// transposed as bytes (three rounds of unpacking gather, per 64-bit lane, byte m of each of the
// 8 planes), then each lane as an 8x8 bit matrix, which gives the byte-plane bytes of 8 elements.
__attribute__((target("avx2"))) void bits_to_planes_avx2(const std::byte* in, std::byte* planes,
                                                         std::size_t n, std::size_t e) noexcept {
  const std::size_t plane = n / 8;
  const std::size_t wide = n / 256;
  for (std::size_t j = 0; j < e; ++j) {
    const std::byte* src = in + 8 * j * plane;
    std::byte* dst = planes + j * n;
    for (std::size_t q = 0; q < wide; ++q) {
      __m256i r[8];
      for (std::size_t k = 0; k < 8; ++k) {
        r[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k * plane + 32 * q));
      }
      // Bytes of planes (0,1), (2,3), ... interleaved; then pairs of pairs; then quadruples.
      __m256i a[8], b[8];
      for (std::size_t k = 0; k < 4; ++k) {
        a[2 * k] = _mm256_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
      }
      for (std::size_t h = 0; h < 2; ++h) {    // lo / hi bytes of the rows
        for (std::size_t g = 0; g < 2; ++g) {  // planes 0-3, 4-7
          const __m256i x = a[4 * g + h], y = a[4 * g + 2 + h];
          b[4 * h + 2 * g] = _mm256_unpacklo_epi16(x, y);
          b[4 * h + 2 * g + 1] = _mm256_unpackhi_epi16(x, y);
        }
      }
      // b[4h + 2g + u]: planes 4g..4g+3 of columns 8h + 4u + (0..3) in each 128-bit lane.
      std::byte* out = dst + 256 * q;
      for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t u = 0; u < 2; ++u) {
          const __m256i lo = b[4 * h + u], hi = b[4 * h + 2 + u];
          const std::size_t col =
              8 * h + 4 * u;  // first column (of 16 in the lane) of these two results
          const __m256i c01 =
              transpose8x8_avx2(_mm256_unpacklo_epi32(lo, hi));  // columns col, col+1
          const __m256i c23 =
              transpose8x8_avx2(_mm256_unpackhi_epi32(lo, hi));  // columns col+2, col+3
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * col), _mm256_castsi256_si128(c01));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * col + 16),
                           _mm256_castsi256_si128(c23));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 128 + 8 * col),
                           _mm256_extracti128_si256(c01, 1));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 128 + 8 * col + 16),
                           _mm256_extracti128_si256(c23, 1));
        }
      }
    }
  }
  if (wide * 32 < plane) bits_to_planes(in, planes, n, e, wide * 32, plane);
}

// 16-bit samples, the detectors' usual pixels: the two byte planes split and merged 32 samples at
// a time.
__attribute__((target("avx2"))) void bytes_to_planes2_avx2(const std::byte* in, std::byte* planes,
                                                           std::size_t n) noexcept {
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                         4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  std::byte* lo = planes;
  std::byte* hi = planes + n;
  const std::size_t wide = n / 32;
  for (std::size_t q = 0; q < wide; ++q) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 64 * q));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 64 * q + 32));
    a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a, split), 0xD8);  // lo 16 | hi 16
    b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, split), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + 32 * q),
                        _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + 32 * q),
                        _mm256_permute2x128_si256(a, b, 0x31));
  }
  for (std::size_t i = wide * 32; i < n; ++i) {
    lo[i] = in[2 * i];
    hi[i] = in[2 * i + 1];
  }
}

__attribute__((target("avx2"))) void planes_to_bytes2_avx2(const std::byte* planes, std::byte* out,
                                                           std::size_t n) noexcept {
  const std::byte* lo = planes;
  const std::byte* hi = planes + n;
  const std::size_t wide = n / 32;
  for (std::size_t q = 0; q < wide; ++q) {
    __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + 32 * q));
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + 32 * q));
    __m256i a = _mm256_unpacklo_epi8(l, h);  // samples 0-7 | 16-23
    __m256i b = _mm256_unpackhi_epi8(l, h);  // samples 8-15 | 24-31
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * q),
                        _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * q + 32),
                        _mm256_permute2x128_si256(a, b, 0x31));
  }
  for (std::size_t i = wide * 32; i < n; ++i) {
    out[2 * i] = lo[i];
    out[2 * i + 1] = hi[i];
  }
}

void shuffle_bits_avx2(const std::byte* in, std::byte* out, std::size_t n, std::size_t e) noexcept {
  const std::byte* planes = in;
  if (e > 1) {
    std::byte* tmp = plane_scratch(n * e);
    if (e == 2) {
      bytes_to_planes2_avx2(in, tmp, n);
    } else {
      bytes_to_planes(in, tmp, n, e);
    }
    planes = tmp;
  }
  planes_to_bits_avx2(planes, out, n, e);
}

void unshuffle_bits_avx2(const std::byte* in, std::byte* out, std::size_t n,
                         std::size_t e) noexcept {
  if (e == 1) return bits_to_planes_avx2(in, out, n, e);
  std::byte* tmp = plane_scratch(n * e);
  bits_to_planes_avx2(in, tmp, n, e);
  if (e == 2) {
    planes_to_bytes2_avx2(tmp, out, n);
  } else {
    planes_to_bytes(tmp, out, n, e);
  }
}
#endif  // __x86_64__

Kernel best_kernel() noexcept {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing in the agent changes its environment
  static const Kernel k = choose_kernel(std::getenv("NUMASTREAM_BSLZ4_KERNEL"));
  return k;
}

}  // namespace

std::size_t default_block_elements(std::size_t elem_size) noexcept {
  std::size_t b = kTargetBlockBytes / (elem_size ? elem_size : 1);
  b = (b / kBlockMultiple) * kBlockMultiple;
  return b > kMinBlockElements ? b : kMinBlockElements;
}

std::size_t max_encoded_size(std::size_t raw_bytes) noexcept {
  // Blocks are at least 128 bytes; each costs its length prefix and LZ4's worst case.
  return kHeaderBytes + raw_bytes + raw_bytes / 255 + (raw_bytes / kMinBlockElements + 2) * 20;
}

const char* kernel_name(Kernel k) noexcept {
  switch (k) {
    case Kernel::avx2:
      return "avx2";
    case Kernel::avx512:
      return "avx512";
    case Kernel::avx512_gfni:
      return "avx512-gfni";
    case Kernel::portable:
      break;
  }
  return "portable";
}

std::vector<Kernel> kernels_available() noexcept {
  std::vector<Kernel> out = {Kernel::portable};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) out.push_back(Kernel::avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vbmi")) {
    out.push_back(Kernel::avx512);
    if (__builtin_cpu_supports("gfni")) out.push_back(Kernel::avx512_gfni);
  }
#endif
  return out;
}

Kernel choose_kernel(const char* cap) noexcept {
  const auto av = kernels_available();
  if (cap && *cap) {
    for (const Kernel c : av) {
      if (std::strcmp(kernel_name(c), cap) == 0) return c;
    }
  }
  return av.back();
}

Kernel kernel_in_use() noexcept { return best_kernel(); }

void shuffle_bits_portable(const std::byte* in, std::byte* out, std::size_t n,
                           std::size_t e) noexcept {
  const std::byte* planes = in;
  if (e > 1) {
    std::byte* tmp = plane_scratch(n * e);
    bytes_to_planes(in, tmp, n, e);
    planes = tmp;
  }
  planes_to_bits(planes, out, n, e, 0, n / 8);
}

void unshuffle_bits_portable(const std::byte* in, std::byte* out, std::size_t n,
                             std::size_t e) noexcept {
  if (e == 1) return bits_to_planes(in, out, n, e, 0, n / 8);
  std::byte* tmp = plane_scratch(n * e);
  bits_to_planes(in, tmp, n, e, 0, n / 8);
  planes_to_bytes(tmp, out, n, e);
}

void shuffle_bits(const std::byte* in, std::byte* out, std::size_t n, std::size_t e) noexcept {
  shuffle_bits(in, out, n, e, best_kernel());
}

void unshuffle_bits(const std::byte* in, std::byte* out, std::size_t n, std::size_t e) noexcept {
  unshuffle_bits(in, out, n, e, best_kernel());
}

// A kernel this CPU lacks (kernels_available) is never asked for; on other CPUs than x86-64 only
// the portable one is.
void shuffle_bits(const std::byte* in, std::byte* out, std::size_t n, std::size_t e,
                  Kernel k) noexcept {
#if defined(__x86_64__)
  if (k == Kernel::avx512 || k == Kernel::avx512_gfni)
    return detail::shuffle_bits_avx512(in, out, n, e, k == Kernel::avx512_gfni);
  if (k == Kernel::avx2) return shuffle_bits_avx2(in, out, n, e);
#else
  (void)k;
#endif
  shuffle_bits_portable(in, out, n, e);
}

void unshuffle_bits(const std::byte* in, std::byte* out, std::size_t n, std::size_t e,
                    Kernel k) noexcept {
#if defined(__x86_64__)
  if (k == Kernel::avx512 || k == Kernel::avx512_gfni)
    return detail::unshuffle_bits_avx512(in, out, n, e, k == Kernel::avx512_gfni);
  if (k == Kernel::avx2) return unshuffle_bits_avx2(in, out, n, e);
#else
  (void)k;
#endif
  unshuffle_bits_portable(in, out, n, e);
}

Workspace::Workspace() : lz4_state_(std::malloc(static_cast<std::size_t>(LZ4_sizeofState()))) {
  if (!lz4_state_) throw std::bad_alloc();
}

Workspace::~Workspace() {
  std::free(lz4_state_);
  delete[] block_;
}

std::byte* Workspace::block(std::size_t bytes) {
  if (block_capacity_ < bytes) {
    delete[] block_;
    block_ = new std::byte[bytes];
    block_capacity_ = bytes;
  }
  return block_;
}

std::size_t Workspace::encode(std::span<const std::byte> raw, std::size_t e,
                              std::span<std::byte> out, std::size_t block_elements,
                              RawObserver* seen) noexcept {
  const std::size_t n = raw.size() / e;
  std::size_t bs = block_elements ? block_elements : default_block_elements(e);
  bs = bs < kMinBlockElements ? kMinBlockElements : bs - bs % kBlockMultiple;
  put_be(out.data(), raw.size(), 8);
  put_be(out.data() + 8, bs * e, 4);
  std::size_t pos = kHeaderBytes;
  std::byte* tmp = block(bs * e);
  auto one_block = [&](std::size_t first, std::size_t count) {
    const std::size_t bytes = count * e;
    shuffle_bits(raw.data() + first * e, tmp, count, e);
    if (seen) seen->raw(raw.subspan(first * e, bytes));  // just read: in the cache
    int c = LZ4_compress_fast_extState(lz4_state_, reinterpret_cast<const char*>(tmp),
                                       reinterpret_cast<char*>(out.data() + pos + 4),
                                       static_cast<int>(bytes),
                                       LZ4_compressBound(static_cast<int>(bytes)), 1);
    put_be(out.data() + pos, static_cast<std::uint64_t>(c), 4);
    pos += 4 + static_cast<std::size_t>(c);
  };
  std::size_t i = 0;
  for (; n - i >= bs; i += bs) one_block(i, bs);
  const std::size_t last = (n - i) - (n - i) % kBlockMultiple;
  if (last) {
    one_block(i, last);
    i += last;
  }
  const std::size_t tail = raw.size() - i * e;
  if (tail) std::memcpy(out.data() + pos, raw.data() + i * e, tail);
  if (tail && seen) seen->raw(raw.subspan(i * e, tail));
  return pos + tail;
}

namespace {

// Walks the framing; `on_block(first element, elements, compressed bytes)` sees each block and
// may refuse it. True when the structure is exactly right.
template <typename F>
bool walk(std::span<const std::byte> in, std::size_t e, std::size_t raw_bytes,
          F on_block) noexcept {
  if (e == 0 || in.size() < kHeaderBytes || raw_bytes % e) return false;
  if (get_be(in.data(), 8) != raw_bytes) return false;
  const std::uint64_t block_bytes = get_be(in.data() + 8, 4);
  if (block_bytes == 0 || block_bytes % (kBlockMultiple * e)) return false;
  const std::size_t n = raw_bytes / e;
  const std::size_t bs = block_bytes / e;
  std::size_t pos = kHeaderBytes;
  auto one = [&](std::size_t first, std::size_t count) {
    if (in.size() - pos < 4) return false;
    const std::size_t c = get_be(in.data() + pos, 4);
    pos += 4;
    if (c == 0 || c > in.size() - pos ||
        c > static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(count * e)))) {
      return false;
    }
    if (!on_block(first, count, in.subspan(pos, c))) return false;
    pos += c;
    return true;
  };
  std::size_t i = 0;
  for (; n - i >= bs; i += bs) {
    if (!one(i, bs)) return false;
  }
  const std::size_t last = (n - i) - (n - i) % kBlockMultiple;
  if (last) {
    if (!one(i, last)) return false;
    i += last;
  }
  return in.size() - pos == raw_bytes - i * e;
}

}  // namespace

bool Workspace::decode(std::span<const std::byte> in, std::size_t e, std::span<std::byte> out,
                       RawObserver* seen) noexcept {
  if (e == 0 || in.size() < kHeaderBytes) return false;
  const std::uint64_t block_bytes = get_be(in.data() + 8, 4);
  if (block_bytes == 0) return false;
  std::byte* tmp;
  try {
    // No block is larger than the output, whatever the header claims.
    tmp = block(std::max<std::size_t>(1, std::min<std::size_t>(block_bytes, out.size())));
  } catch (...) {
    return false;
  }
  bool ok = walk(
      in, e, out.size(), [&](std::size_t first, std::size_t count, std::span<const std::byte> c) {
        const int bytes = static_cast<int>(count * e);
        int got =
            LZ4_decompress_safe(reinterpret_cast<const char*>(c.data()),
                                reinterpret_cast<char*>(tmp), static_cast<int>(c.size()), bytes);
        if (got != bytes) return false;
        unshuffle_bits(tmp, out.data() + first * e, count, e);
        if (seen) seen->raw(out.subspan(first * e, count * e));  // just written: in the cache
        return true;
      });
  if (!ok) return false;
  const std::size_t tail_elements = (out.size() / e) % kBlockMultiple;
  const std::size_t tail = tail_elements * e;
  if (tail) std::memcpy(out.data() + out.size() - tail, in.data() + in.size() - tail, tail);
  if (tail && seen) seen->raw(out.last(tail));
  return true;
}

bool check_framing(std::span<const std::byte> in, std::size_t e, std::size_t raw_bytes) noexcept {
  return walk(in, e, raw_bytes,
              [](std::size_t, std::size_t, std::span<const std::byte>) { return true; });
}

}  // namespace numastream::bslz4
