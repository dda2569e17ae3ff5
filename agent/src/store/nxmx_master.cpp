#include "store/nxmx_master.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <stdexcept>

#include "base/error.hpp"
#include "detector/stream2.hpp"
#include "store/hdf5_detail.hpp"
#include "store/nxmx_layout.hpp"

namespace numastream::hdf5 {

using namespace detail;

std::string data_file_name(const std::string& prefix, std::uint64_t k) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_data_%06llu.h5", static_cast<unsigned long long>(k));
  return prefix + suffix;
}

void write_master(const std::string& path, const NxmxMaster& m) {
  quiet();
  const std::string tmp = path + ".tmp";
  hid_t file = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) fail(tmp, "create the file");
  try {
    write_master_body(file, tmp, m);
  } catch (...) {
    H5Fclose(file);
    H5Eclear2(H5E_DEFAULT);
    std::remove(tmp.c_str());
    throw;
  }
  // Closing a file with datasets whose filter HDF5 has not loaded leaves an error on its stack
  // (see SeriesFile::close): cleared.
  const bool closed = H5Fclose(file) >= 0;
  H5Eclear2(H5E_DEFAULT);
  if (!closed) throw std::runtime_error(tmp + ": close failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("rename " + tmp + " to " + path + ": " + errno_text(errno));
  }
}

std::optional<NxmxMaster> read_master(const std::string& path) {
  quiet();
  if (H5Fis_hdf5(path.c_str()) <= 0) return std::nullopt;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return std::nullopt;
  std::optional<NxmxMaster> out;
  if (H5Lexists(file, "/entry", H5P_DEFAULT) > 0 && H5Lexists(file, kNumastream, H5P_DEFAULT) > 0) {
    hid_t entry = H5Gopen2(file, "/entry", H5P_DEFAULT);
    hid_t g = H5Gopen2(file, kNumastream, H5P_DEFAULT);
    const auto series = read_u64_attribute(entry, "series_id");
    const auto per_file = read_u64_attribute(g, "frames_per_file");
    if (series && per_file) {
      NxmxMaster m;
      m.series_id = *series;
      m.series_unique_id = read_text_attribute(entry, "series_unique_id");
      m.incomplete = read_text_attribute(entry, "incomplete");
      m.stream_id = static_cast<std::uint32_t>(read_u64_attribute(g, "stream_id").value_or(0));
      m.frames_per_file = *per_file;
      m.data_prefix = read_text_attribute(g, "data_prefix");
      m.start_time = read_text_attribute(g, "gateway_start_time");
      m.instrument = read_text_attribute(g, "instrument");
      m.source = read_text_attribute(g, "source");
      m.sample = read_text_attribute(g, "sample");
      m.start_sequence = read_u64_attribute(g, "start_sequence");
      m.end_sequence = read_u64_attribute(g, "end_sequence");
      bool ok = true;
      if (H5Lexists(file, "/entry/end_time", H5P_DEFAULT) > 0) {
        hid_t d = H5Dopen2(file, "/entry/end_time", H5P_DEFAULT);
        hid_t t = vlen_text();
        char* p = nullptr;
        ok = d >= 0 && H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p) >= 0 && p;
        if (ok) m.end_time = p;
        if (p) H5free_memory(p);
        H5Tclose(t);
        if (d >= 0) H5Dclose(d);
      }
      const std::string start = std::string(kDetector) + "/stream2_start";
      if (ok && H5Lexists(file, "/entry/instrument", H5P_DEFAULT) > 0 &&
          H5Lexists(file, kDetector, H5P_DEFAULT) > 0 &&
          H5Lexists(file, start.c_str(), H5P_DEFAULT) > 0) {
        hid_t d = H5Dopen2(file, start.c_str(), H5P_DEFAULT);
        hid_t space = H5Dget_space(d);
        hsize_t n = 0;
        H5Sget_simple_extent_dims(space, &n, nullptr);
        m.start.resize(n);
        ok = H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.start.data()) >= 0;
        H5Sclose(space);
        H5Dclose(d);
      }
      if (ok) out = std::move(m);
    }
    H5Gclose(g);
    H5Gclose(entry);
  }
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

}  // namespace numastream::hdf5
