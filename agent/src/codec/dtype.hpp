// Pixel types a chunk may hold: "uint8", "uint16", "uint32", "uint64", "int8", "int16",
// "int32", "int64", "float32", "float64" (little-endian, as detectors and HDF5 files store them).
#pragma once

#include <cstddef>
#include <string>

namespace numastream {

std::size_t dtype_size(const std::string& dtype) noexcept;  // bytes; 0 when unknown
inline bool dtype_known(const std::string& dtype) noexcept { return dtype_size(dtype) != 0; }

}  // namespace numastream
