// Bitshuffle + LZ4 ("bslz4"), byte-compatible with the HDF5 bitshuffle filter (id 32008) and the
// data DECTRIS detectors send: what Compressor produces can be written into an HDF5 chunk as is,
// and any bitshuffle reader decodes it.
//
// Framing (all integers big-endian):
//   u64 raw size in bytes | u32 block size in bytes
//   per full block, then for the last partial block (its element count rounded down to a
//   multiple of 8): u32 compressed length | LZ4 block of the bit-shuffled elements
//   the last (elements % 8) elements, verbatim
// The element size is not in the framing: HDF5 keeps it in the filter's parameters, DECTRIS in
// the message, numastream in the frame header.
//
// Bit-shuffle of n elements (n a multiple of 8) of e bytes: 8e bit planes of n bits each; plane p
// holds bit p (little-endian bit order within the element) of every element, element i at bit
// i % 8 of byte i / 8. The portable, AVX2 and AVX-512 kernels produce the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/raw_observer.hpp"

namespace numastream::bslz4 {

inline constexpr std::size_t kHeaderBytes = 12;
inline constexpr std::uint32_t kHdf5FilterId = 32008;
// cd_values[4] of the HDF5 filter: LZ4 after the shuffle.
inline constexpr unsigned kHdf5CompressLz4 = 2;

// The reference library's default: blocks of ~8 KiB, a multiple of 8 elements, at least 128.
std::size_t default_block_elements(std::size_t elem_size) noexcept;

// Worst case of encode() for `raw_bytes`.
std::size_t max_encoded_size(std::size_t raw_bytes) noexcept;

// One bit-shuffle; `in` and `out` hold n * elem_size bytes, n a multiple of 8, no overlap.
void shuffle_bits(const std::byte* in, std::byte* out, std::size_t n,
                  std::size_t elem_size) noexcept;
void unshuffle_bits(const std::byte* in, std::byte* out, std::size_t n,
                    std::size_t elem_size) noexcept;
// The portable versions.
void shuffle_bits_portable(const std::byte* in, std::byte* out, std::size_t n,
                           std::size_t elem_size) noexcept;
void unshuffle_bits_portable(const std::byte* in, std::byte* out, std::size_t n,
                             std::size_t elem_size) noexcept;

// The kernels, chosen at run time: the best one the CPU has (AVX-512 needs F, BW and VBMI, its
// GFNI variant GFNI too); NUMASTREAM_BSLZ4_KERNEL (portable, avx2, avx512, avx512-gfni) names
// another this CPU runs. Every kernel writes the same bytes.
enum class Kernel { portable, avx2, avx512, avx512_gfni };
const char* kernel_name(Kernel k) noexcept;
// The kernels this CPU runs, portable first, the best last.
std::vector<Kernel> kernels_available() noexcept;
// The kernel shuffle_bits and unshuffle_bits (and so encode and decode) use:
// choose_kernel(NUMASTREAM_BSLZ4_KERNEL), read once.
Kernel kernel_in_use() noexcept;
// The kernel named by `cap` when this CPU runs it, else the best it runs.
Kernel choose_kernel(const char* cap) noexcept;
// One kernel by name; `k` must be one of kernels_available().
void shuffle_bits(const std::byte* in, std::byte* out, std::size_t n, std::size_t elem_size,
                  Kernel k) noexcept;
void unshuffle_bits(const std::byte* in, std::byte* out, std::size_t n, std::size_t elem_size,
                    Kernel k) noexcept;

// Scratch space one thread reuses: a shuffled block and LZ4's state.
class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Encodes raw (a whole number of elements) into `out` (at least max_encoded_size(raw.size())).
  // Returns the bytes written. `block_elements` 0 takes the default. `seen` (if any) is shown
  // each block of `raw` as it is shuffled.
  std::size_t encode(std::span<const std::byte> raw, std::size_t elem_size,
                     std::span<std::byte> out, std::size_t block_elements = 0,
                     RawObserver* seen = nullptr) noexcept;
  // Decodes into exactly out.size() bytes. False for anything malformed: a raw size that is not
  // out.size(), a block size that is not a positive multiple of 8 elements, a block length past the
  // end, an LZ4 block that does not decode to exactly its size, bytes left over. `seen` (if any)
  // is shown each block of `out` as it is unshuffled (what it saw is meaningless when this fails).
  bool decode(std::span<const std::byte> in, std::size_t elem_size, std::span<std::byte> out,
              RawObserver* seen = nullptr) noexcept;

 private:
  std::byte* block(std::size_t bytes);
  std::byte* block_ = nullptr;
  std::size_t block_capacity_ = 0;
  void* lz4_state_ = nullptr;
};

// The framing's structure without decoding: the raw size is `raw_bytes`, the block size is valid
// for `elem_size`, every block length lies inside the input and the last one ends where the
// verbatim tail begins. What a gateway checks of a frame it stores without decompressing.
bool check_framing(std::span<const std::byte> in, std::size_t elem_size,
                   std::size_t raw_bytes) noexcept;

}  // namespace numastream::bslz4
