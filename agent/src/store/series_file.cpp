#include "store/series_file.hpp"

#include <hdf5.h>

#include <stdexcept>

#include "codec/bitshuffle.hpp"
#include "codec/dtype.hpp"
#include "store/hdf5_detail.hpp"

namespace numastream::hdf5 {

using namespace detail;

namespace {

constexpr const char* kDetector = "/entry/instrument/detector/";
constexpr H5Z_filter_t kLz4Filter = 32004;  // the HDF5 LZ4 filter, whose framing lz4 frames carry

hid_t vlen_text() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

void text_attribute(hid_t obj, const char* name, const std::string& value, const std::string& what) {
  hid_t type = vlen_text();
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = value.c_str();
  const bool ok = attr >= 0 && H5Awrite(attr, type, &p) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
  if (!ok) fail(what, std::string("write attribute ") + name);
}

void group(hid_t file, const std::string& path, const char* nx_class, const std::string& what) {
  make_parents(file, path + "/", what);
  hid_t g = H5Gopen2(file, path.c_str(), H5P_DEFAULT);
  if (g < 0) fail(what, "open group " + path);
  text_attribute(g, "NX_class", nx_class, what);
  H5Gclose(g);
}

// A dataset of `space` written at once from `data` of `mem_type` (the file type `file_type`).
void dataset(hid_t file, const std::string& path, hid_t file_type_id, hid_t mem_type, hid_t space, const void* data,
             const std::string& what) {
  make_parents(file, path, what);
  hid_t d = H5Dcreate2(file, path.c_str(), file_type_id, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = d >= 0 && H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
  if (d >= 0) H5Dclose(d);
  if (!ok) fail(what, "write " + path);
}

// The creation properties of a dataset chunked by `chunk`, declaring the filter its chunks carry.
hid_t chunked(int rank, const hsize_t* chunk, stream2::Compression c, std::size_t elem, const std::string& what) {
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, rank, chunk);
  herr_t rc = 0;
  if (c == stream2::Compression::bslz4) {
    const unsigned cd[5] = {0, 4, static_cast<unsigned>(elem), 0, bslz4::kHdf5CompressLz4};
    rc = H5Pset_filter(dcpl, static_cast<H5Z_filter_t>(bslz4::kHdf5FilterId), H5Z_FLAG_OPTIONAL, 5, cd);
  } else if (c == stream2::Compression::lz4) {
    rc = H5Pset_filter(dcpl, kLz4Filter, H5Z_FLAG_OPTIONAL, 0, nullptr);
  }
  if (rc < 0) {
    H5Pclose(dcpl);
    fail(what, std::string("declare the ") + stream2::compression_name(c) + " filter");
  }
  return dcpl;
}

}  // namespace

SeriesFile::SeriesFile(const std::string& path) : path_(path) {
  quiet();
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) fail(path_, "create the file");
  group(file_, "/entry", "NXentry", path_);
  group(file_, "/entry/data", "NXdata", path_);
  group(file_, "/entry/instrument", "NXinstrument", path_);
  group(file_, "/entry/instrument/detector", "NXdetector", path_);
}

SeriesFile::~SeriesFile() {
  try {
    close();
  } catch (...) {
  }
}

std::vector<std::string> SeriesFile::write_start(std::span<const std::byte> message, std::uint64_t series_id,
                                                 const std::string& series_unique_id) {
  std::vector<std::string> skipped;
  std::string error;
  if (!stream2::walk(message, [&](const std::string& p, const stream2::Value& v) { write_field(p, v); }, skipped,
                     error)) {
    throw std::runtime_error(path_ + ": the start message: " + error);
  }
  const hsize_t n = message.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  dataset(file_, std::string(kDetector) + "stream2_start", H5T_STD_U8LE, H5T_NATIVE_UINT8, space, message.data(), path_);
  H5Sclose(space);
  hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
  hid_t scalar = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(entry, "series_id", H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_UINT64, &series_id) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(scalar);
  if (ok) text_attribute(entry, "series_unique_id", series_unique_id, path_);
  H5Gclose(entry);
  if (!ok) fail(path_, "write attribute series_id");
  return skipped;
}

void SeriesFile::write_field(const std::string& field, const stream2::Value& v) {
  const std::string path = kDetector + field;
  make_parents(file_, path, path_);
  if (H5Lexists(file_, path.c_str(), H5P_DEFAULT) != 0) return;  // the first value of a field stays
  using K = stream2::Value::Kind;
  hid_t scalar = H5Screate(H5S_SCALAR);
  switch (v.kind) {
    case K::unsigned_integer:
      dataset(file_, path, H5T_STD_U64LE, H5T_NATIVE_UINT64, scalar, &v.u, path_);
      break;
    case K::integer:
      dataset(file_, path, H5T_STD_I64LE, H5T_NATIVE_INT64, scalar, &v.i, path_);
      break;
    case K::real:
      dataset(file_, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &v.d, path_);
      break;
    case K::boolean: {
      const std::uint8_t b = v.b;
      dataset(file_, path, H5T_STD_U8LE, H5T_NATIVE_UINT8, scalar, &b, path_);
      break;
    }
    case K::text: {
      const std::string s(v.s);
      const char* p = s.c_str();
      hid_t t = vlen_text();
      dataset(file_, path, t, t, scalar, &p, path_);
      H5Tclose(t);
      break;
    }
    case K::reals: {
      const hsize_t n = v.reals.size();
      hid_t space = H5Screate_simple(1, &n, nullptr);
      dataset(file_, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space, v.reals.data(), path_);
      H5Sclose(space);
      break;
    }
    case K::texts: {
      std::vector<std::string> held(v.texts.begin(), v.texts.end());
      std::vector<const char*> ptrs;
      for (const auto& s : held) ptrs.push_back(s.c_str());
      const hsize_t n = ptrs.size();
      hid_t space = H5Screate_simple(1, &n, nullptr);
      hid_t t = vlen_text();
      dataset(file_, path, t, t, space, ptrs.data(), path_);
      H5Tclose(t);
      H5Sclose(space);
      break;
    }
    case K::array: {
      const auto& a = v.array;
      std::vector<hsize_t> dims(a.dims.begin(), a.dims.end());
      hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
      hid_t type = file_type(a.dtype);
      if (a.compression == stream2::Compression::none) {
        dataset(file_, path, type, type, space, a.bytes.data(), path_);
      } else {
        // Stored as the detector compressed it: one chunk, the whole array.
        make_parents(file_, path, path_);
        hid_t dcpl = chunked(static_cast<int>(dims.size()), dims.data(), a.compression, dtype_size(a.dtype), path_);
        hid_t d = H5Dcreate2(file_, path.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        H5Pclose(dcpl);
        const std::vector<hsize_t> zero(dims.size(), 0);
        const bool ok = d >= 0 && H5Dwrite_chunk(d, H5P_DEFAULT, 0, zero.data(), a.bytes.size(), a.bytes.data()) >= 0;
        if (d >= 0) H5Dclose(d);
        if (!ok) {
          H5Sclose(space);
          H5Sclose(scalar);
          fail(path_, "write " + path);
        }
      }
      H5Sclose(space);
      break;
    }
  }
  H5Sclose(scalar);
}

SeriesFile::Channel& SeriesFile::channel(const std::string& name, const stream2::Array& a) {
  auto it = channels_.find(name);
  if (it != channels_.end()) {
    const Channel& c = it->second;
    if (c.dims != a.dims || c.dtype != a.dtype || c.compression != a.compression) {
      throw std::runtime_error(path_ + ": channel " + name + ": an image of " + a.dtype + " " +
                               stream2::compression_name(a.compression) + " differs from the channel's first image (" +
                               c.dtype + " " + stream2::compression_name(c.compression) + ")");
    }
    return it->second;
  }
  if (a.dims.empty() || a.dims.size() > 2) {
    throw std::runtime_error(path_ + ": channel " + name + ": an image has 1 or 2 dimensions, this one " +
                             std::to_string(a.dims.size()));
  }
  Channel c;
  c.dims = a.dims;
  c.dtype = a.dtype;
  c.compression = a.compression;
  const int rank = static_cast<int>(a.dims.size()) + 1;
  hsize_t dims[3] = {0, a.dims[0], rank == 3 ? a.dims[1] : 0};
  hsize_t max[3] = {H5S_UNLIMITED, dims[1], dims[2]};
  hsize_t chunk[3] = {1, dims[1], dims[2]};
  const std::string path = "/entry/data/" + name;
  hid_t space = H5Screate_simple(rank, dims, max);
  hid_t dcpl = chunked(rank, chunk, a.compression, dtype_size(a.dtype), path_);
  c.dset = H5Dcreate2(file_, path.c_str(), file_type(a.dtype), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(space);
  if (c.dset < 0) fail(path_, "create " + path);
  if (channels_.empty()) {
    hid_t g = H5Gopen2(file_, "/entry/data", H5P_DEFAULT);
    text_attribute(g, "signal", name, path_);
    H5Gclose(g);
  }
  return channels_.emplace(name, std::move(c)).first->second;
}

void SeriesFile::write_image(std::span<const std::byte> message, std::uint64_t image_id) {
  std::vector<std::string> skipped;
  std::string error;
  const bool ok = stream2::walk(
      message,
      [&](const std::string& p, const stream2::Value& v) {
        if (p.rfind("data/", 0) != 0 || v.kind != stream2::Value::Kind::array) return;
        const std::string name = p.substr(5);
        Channel& c = channel(name, v.array);
        const hsize_t frame[2] = {c.dims[0], c.dims.size() > 1 ? c.dims[1] : 0};
        write_chunk(c.dset, static_cast<int>(c.dims.size()) + 1, frame, c.extent, image_id, v.array.bytes.data(),
                    v.array.bytes.size(), 0, path_ + ":/entry/data/" + name);
        written_[name].insert(image_id);
      },
      skipped, error);
  if (!ok) throw std::runtime_error(path_ + ": image " + std::to_string(image_id) + ": " + error);
}

void SeriesFile::mark_missing(const std::string& missing) {
  if (file_ < 0) return;
  hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
  if (entry < 0) fail(path_, "open /entry");
  if (H5Aexists(entry, "incomplete") > 0) H5Adelete(entry, "incomplete");
  text_attribute(entry, "incomplete", missing, path_);
  H5Gclose(entry);
}

void SeriesFile::flush() {
  if (file_ >= 0 && H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(path_, "flush");
}

void SeriesFile::close() {
  for (auto& [name, c] : channels_) {
    if (c.dset >= 0) H5Dclose(c.dset);
    c.dset = -1;
  }
  if (file_ >= 0 && H5Fclose(file_) < 0) {
    file_ = -1;
    fail(path_, "close");
  }
  file_ = -1;
  // Closing a dataset whose filter HDF5 has not loaded (it need not: chunks are written as they
  // are) leaves "filter not registered" on HDF5's error stack; left there, it keeps the library
  // from closing at exit ("infinite loop closing library").
  H5Eclear2(H5E_DEFAULT);
}

}  // namespace numastream::hdf5
