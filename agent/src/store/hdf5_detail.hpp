// What the agent's HDF5 writers and readers share (internal to the store layer): HDF5's error
// stack turned into one sentence, the dtype names' HDF5 types, groups made on the way to a path.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <set>
#include <string>

namespace numastream::hdf5::detail {

// HDF5 prints its error stack on stderr by default; the agent says what failed in its own words.
void quiet();
// Throws std::runtime_error "<what>: <doing>: <HDF5's innermost reason>".
[[noreturn]] void fail(const std::string& what, const std::string& doing);
// The little-endian file type of a dtype name (codec/dtype.hpp); throws for an unknown one.
hid_t file_type(const std::string& dtype);
// The dtype name of a dataset's type, little-endian as stored by detectors; "" when it is not a
// plain integer or float.
std::string dtype_of(hid_t type);
// Opens every group of `path` below the root, creating the missing ones.
void make_parents(hid_t file, const std::string& path, const std::string& what);
// The frames a frames x ... dataset holds: the first coordinates of its allocated chunks (one
// frame per chunk).
std::set<std::uint64_t> frames_written(hid_t dset, const std::string& what);
// Writes `bytes` as the chunk of frame `index` of a frames x ... dataset of `rank` (2 or 3) with
// direct chunk I/O, extending the dataset when `index` is past `extent`; `filter_mask` bit 0 set
// when the chunk is stored without the dataset's filter.
void write_chunk(hid_t dset, int rank, const hsize_t* frame_dims, std::uint64_t& extent, std::uint64_t index,
                 const void* bytes, std::size_t size, std::uint32_t filter_mask, const std::string& what);

}  // namespace numastream::hdf5::detail
