#include "codec/hdf5_lz4.hpp"

#include <lz4.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace numastream::hdf5_lz4 {
namespace {

void put_be(std::byte* p, std::uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, v >>= 8) p[i] = static_cast<std::byte>(v & 0xff);
}

std::uint64_t get_be(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = v << 8 | static_cast<std::uint8_t>(p[i]);
  return v;
}

}  // namespace

std::vector<std::byte> encode(std::span<const std::byte> raw, std::size_t block_bytes) {
  if (block_bytes == 0 || block_bytes > (1u << 30))
    throw std::invalid_argument("hdf5_lz4: block size out of range");
  std::vector<std::byte> out(
      12 + raw.size() +
      (raw.size() / block_bytes + 1) *
          (4 + static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(block_bytes)))));
  put_be(out.data(), raw.size(), 8);
  put_be(out.data() + 8, block_bytes, 4);
  std::size_t pos = 12;
  for (std::size_t off = 0; off < raw.size(); off += block_bytes) {
    const std::size_t n = std::min(block_bytes, raw.size() - off);
    const char* src = reinterpret_cast<const char*>(raw.data() + off);
    char* dst = reinterpret_cast<char*>(out.data() + pos + 4);
    int c =
        LZ4_compress_default(src, dst, static_cast<int>(n), LZ4_compressBound(static_cast<int>(n)));
    if (c <= 0 || static_cast<std::size_t>(c) >= n) {  // stored as it is
      std::memcpy(dst, src, n);
      c = static_cast<int>(n);
    }
    put_be(out.data() + pos, static_cast<std::uint64_t>(c), 4);
    pos += 4 + static_cast<std::size_t>(c);
  }
  out.resize(pos);
  return out;
}

bool decode(std::span<const std::byte> in, std::span<std::byte> out) noexcept {
  if (in.size() < 12 || get_be(in.data(), 8) != out.size()) return false;
  const std::size_t block = get_be(in.data() + 8, 4);
  if (block == 0) return false;
  std::size_t pos = 12;
  for (std::size_t off = 0; off < out.size(); off += block) {
    const std::size_t n = std::min(block, out.size() - off);
    if (in.size() - pos < 4) return false;
    const std::size_t c = get_be(in.data() + pos, 4);
    pos += 4;
    if (c > in.size() - pos) return false;
    char* dst = reinterpret_cast<char*>(out.data() + off);
    if (c == n) {
      std::memcpy(dst, in.data() + pos, n);
    } else if (LZ4_decompress_safe(reinterpret_cast<const char*>(in.data() + pos), dst,
                                   static_cast<int>(c),
                                   static_cast<int>(n)) != static_cast<int>(n)) {
      return false;
    }
    pos += c;
  }
  return pos == in.size();
}

}  // namespace numastream::hdf5_lz4
