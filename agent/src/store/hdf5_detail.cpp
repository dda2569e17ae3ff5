#include "store/hdf5_detail.hpp"

#include <stdexcept>

namespace numastream::hdf5::detail {
namespace {

struct Quiet {
  Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};

}  // namespace

void quiet() {
  // Debian's libhdf5 keeps an error stack per thread: each thread that calls it is quieted (a sink
  // opened on the sink thread is closed on the main thread).
  thread_local Quiet q;
}

namespace {

// The innermost message of HDF5's error stack.
std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD,
           [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
             auto* r = static_cast<std::string*>(data);
             if (n == 0 && e->desc) *r = e->desc;
             return 0;
           },
           &reason);
  return reason.empty() ? "HDF5 error" : reason;
}

}  // namespace

[[noreturn]] void fail(const std::string& what, const std::string& doing) {
  std::string reason = hdf5_reason();
  H5Eclear2(H5E_DEFAULT);
  throw std::runtime_error(what + ": " + doing + ": " + reason);
}

namespace {

struct TypeInfo {
  const char* name;
  hid_t (*type)();
};

hid_t t_u8() { return H5T_STD_U8LE; }
hid_t t_u16() { return H5T_STD_U16LE; }
hid_t t_u32() { return H5T_STD_U32LE; }
hid_t t_u64() { return H5T_STD_U64LE; }
hid_t t_i8() { return H5T_STD_I8LE; }
hid_t t_i16() { return H5T_STD_I16LE; }
hid_t t_i32() { return H5T_STD_I32LE; }
hid_t t_i64() { return H5T_STD_I64LE; }
hid_t t_f32() { return H5T_IEEE_F32LE; }
hid_t t_f64() { return H5T_IEEE_F64LE; }

const TypeInfo kTypes[] = {{"uint8", t_u8},   {"uint16", t_u16}, {"uint32", t_u32}, {"uint64", t_u64},
                           {"int8", t_i8},    {"int16", t_i16},  {"int32", t_i32},  {"int64", t_i64},
                           {"float32", t_f32}, {"float64", t_f64}};

}  // namespace

hid_t file_type(const std::string& dtype) {
  for (const auto& t : kTypes) {
    if (dtype == t.name) return t.type();
  }
  throw std::runtime_error("unknown dtype \"" + dtype + "\"");
}

std::string dtype_of(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (H5Tget_order(type) != H5T_ORDER_LE) return "";
  if (cls == H5T_INTEGER) {
    const bool sign = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1 || size == 2 || size == 4 || size == 8) {
      return std::string(sign ? "int" : "uint") + std::to_string(size * 8);
    }
  } else if (cls == H5T_FLOAT && (size == 4 || size == 8)) {
    return "float" + std::to_string(size * 8);
  }
  return "";
}

void make_parents(hid_t file, const std::string& path, const std::string& what) {
  std::size_t pos = 1;
  while ((pos = path.find('/', pos)) != std::string::npos) {
    std::string group = path.substr(0, pos);
    if (H5Lexists(file, group.c_str(), H5P_DEFAULT) <= 0) {
      hid_t g = H5Gcreate2(file, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (g < 0) fail(what, "create group " + group);
      H5Gclose(g);
    }
    ++pos;
  }
}

void write_chunk(hid_t dset, int rank, const hsize_t* frame_dims, std::uint64_t& extent, std::uint64_t index,
                 const void* bytes, std::size_t size, std::uint32_t filter_mask, const std::string& what) {
  if (index >= extent) {
    hsize_t dims[3] = {index + 1, frame_dims[0], rank == 3 ? frame_dims[1] : 0};
    if (H5Dset_extent(dset, dims) < 0) fail(what, "extend to " + std::to_string(index + 1) + " frames");
    extent = index + 1;
  }
  hsize_t offset[3] = {index, 0, 0};
  if (H5Dwrite_chunk(dset, H5P_DEFAULT, filter_mask, offset, size, bytes) < 0) {
    fail(what, "write frame " + std::to_string(index));
  }
}

std::set<std::uint64_t> frames_written(hid_t dset, const std::string& what) {
  std::set<std::uint64_t> out;
  hid_t space = H5Dget_space(dset);
  hsize_t n = 0;
  if (space < 0 || H5Dget_num_chunks(dset, space, &n) < 0) {
    if (space >= 0) H5Sclose(space);
    fail(what, "list the frames of the file being resumed");
  }
  for (hsize_t i = 0; i < n; ++i) {
    hsize_t offset[3] = {};
    if (H5Dget_chunk_info(dset, space, i, offset, nullptr, nullptr, nullptr) >= 0) out.insert(offset[0]);
  }
  H5Sclose(space);
  return out;
}

}  // namespace numastream::hdf5::detail
