// The bit-shuffle's kernels, shared by bitshuffle.cpp (portable and AVX2) and
// bitshuffle_avx512.cpp (AVX-512). Internal to the codec layer.
//
// A shuffle is two steps: bytes to byte planes (byte j of every element together; none for
// one-byte elements), then byte planes to bit planes (an 8x8 bit transpose per 8 elements); the
// unshuffle is the reverse. Each step's portable version does any range of 8-element groups, so a
// vector kernel does the whole vectors and leaves the rest to it.
#pragma once

#include <cstddef>

namespace numastream::bslz4::detail {

// Bit planes from byte planes (e planes of n bytes), groups [m0, m1) of 8 elements; and back.
void planes_to_bits(const std::byte* planes, std::byte* out, std::size_t n, std::size_t e,
                    std::size_t m0, std::size_t m1) noexcept;
void bits_to_planes(const std::byte* in, std::byte* planes, std::size_t n, std::size_t e,
                    std::size_t m0, std::size_t m1) noexcept;
// Byte planes of elements [i0, n) from the elements; and back.
void bytes_to_planes(const std::byte* in, std::byte* planes, std::size_t n, std::size_t e,
                     std::size_t i0 = 0) noexcept;
void planes_to_bytes(const std::byte* planes, std::byte* out, std::size_t n, std::size_t e,
                     std::size_t i0 = 0) noexcept;
// A thread's scratch for byte planes, at least `bytes` long.
std::byte* plane_scratch(std::size_t bytes);

// AVX-512 (F, BW, VBMI; with `gfni`, GFNI too): called only where the CPU has them.
void shuffle_bits_avx512(const std::byte* in, std::byte* out, std::size_t n, std::size_t e,
                         bool gfni) noexcept;
void unshuffle_bits_avx512(const std::byte* in, std::byte* out, std::size_t n, std::size_t e,
                           bool gfni) noexcept;

}  // namespace numastream::bslz4::detail
