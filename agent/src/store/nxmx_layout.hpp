// The NXmx master file's layout (nxmx_body.cpp writes it, nxmx_master.cpp reads its own record
// back). Internal to the store layer.
#pragma once
#include <hdf5.h>

#include <string>

#include "store/nxmx_master.hpp"

namespace numastream::hdf5::detail {

inline constexpr const char* kDetector = "/entry/instrument/detector";
inline constexpr const char* kNumastream = "/entry/numastream";

// Every group, dataset and attribute of the master `m` into `file` (named `path` in errors).
void write_master_body(hid_t file, const std::string& path, const NxmxMaster& m);

}  // namespace numastream::hdf5::detail
