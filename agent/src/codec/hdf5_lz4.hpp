// LZ4 in the framing of the HDF5 LZ4 filter (32004), which DECTRIS detectors use for "lz4"
// frames: the raw size (8 bytes, big-endian), the block size (4 bytes, big-endian), then per block
// its stored length (4 bytes, big-endian) and an LZ4 block, or the block's bytes as they are when
// LZ4 would not make it smaller (stored length = the block's size).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace numastream::hdf5_lz4 {

inline constexpr std::size_t kDefaultBlockBytes = 8192;  // what DECTRIS detectors use

std::vector<std::byte> encode(std::span<const std::byte> raw,
                              std::size_t block_bytes = kDefaultBlockBytes);
// Decodes into exactly out.size() bytes; false for anything malformed.
bool decode(std::span<const std::byte> in, std::span<std::byte> out) noexcept;

}  // namespace numastream::hdf5_lz4
