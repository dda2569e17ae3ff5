#include "store/hdf5_detail.hpp"

#include <H5PLpublic.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/bitshuffle.hpp"
#include "codec/dtype.hpp"

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
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
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

const TypeInfo kTypes[] = {
    {"uint8", t_u8},  {"uint16", t_u16}, {"uint32", t_u32}, {"uint64", t_u64},  {"int8", t_i8},
    {"int16", t_i16}, {"int32", t_i32},  {"int64", t_i64},  {"float32", t_f32}, {"float64", t_f64}};

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

void write_chunk(hid_t dset, int rank, const hsize_t* frame_dims, std::uint64_t& extent,
                 std::uint64_t index, const void* bytes, std::size_t size,
                 std::uint32_t filter_mask, const std::string& what) {
  if (index >= extent) {
    hsize_t dims[3] = {index + 1, frame_dims[0], rank == 3 ? frame_dims[1] : 0};
    if (H5Dset_extent(dset, dims) < 0)
      fail(what, "extend to " + std::to_string(index + 1) + " frames");
    extent = index + 1;
  }
  hsize_t offset[3] = {index, 0, 0};
  if (H5Dwrite_chunk(dset, H5P_DEFAULT, filter_mask, offset, size, bytes) < 0) {
    fail(what, "write frame " + std::to_string(index));
  }
}

hid_t open_to_resume(const std::string& path, hid_t fapl) {
  // Through HDF5's own driver first (H5Fincrement_filesize asks for one SWMR readers can use),
  // then as the caller asked.
  const hid_t repair = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (repair < 0) return -1;
  const bool adopted = H5Fincrement_filesize(repair, 0) >= 0;
  if (H5Fclose(repair) < 0 || !adopted) return -1;
  return H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
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
    if (H5Dget_chunk_info(dset, space, i, offset, nullptr, nullptr, nullptr) >= 0)
      out.insert(offset[0]);
  }
  H5Sclose(space);
  return out;
}

hid_t vlen_text() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

void text_attribute(hid_t obj, const char* name, const std::string& value,
                    const std::string& what) {
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

void dataset(hid_t file, const std::string& path, hid_t file_type_id, hid_t mem_type, hid_t space,
             const void* data, const std::string& what) {
  make_parents(file, path, what);
  hid_t d =
      H5Dcreate2(file, path.c_str(), file_type_id, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = d >= 0 && H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
  if (d >= 0) H5Dclose(d);
  if (!ok) fail(what, "write " + path);
}

PluginsOff::PluginsOff() : known_(H5PLget_loading_state(&state_) >= 0) { H5PLset_loading_state(0); }
PluginsOff::~PluginsOff() {
  if (known_) H5PLset_loading_state(state_);
}

hid_t chunked(int rank, const hsize_t* chunk, stream2::Compression c, std::size_t elem,
              const std::string& what) {
  PluginsOff off;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, rank, chunk);
  herr_t rc = 0;
  if (c == stream2::Compression::bslz4) {
    const unsigned cd[5] = {0, 4, static_cast<unsigned>(elem), 0, bslz4::kHdf5CompressLz4};
    rc = H5Pset_filter(dcpl, static_cast<H5Z_filter_t>(bslz4::kHdf5FilterId), H5Z_FLAG_OPTIONAL, 5,
                       cd);
  } else if (c == stream2::Compression::lz4) {
    rc = H5Pset_filter(dcpl, kLz4Filter, H5Z_FLAG_OPTIONAL, 0, nullptr);
  }
  if (rc < 0) {
    H5Pclose(dcpl);
    fail(what, std::string("declare the ") + stream2::compression_name(c) + " filter");
  }
  return dcpl;
}

hid_t create_as_declared(hid_t loc, const std::string& path, hid_t type, hid_t space, hid_t dcpl,
                         const std::string& what) {
  hid_t d;
  {
    PluginsOff off;
    d = H5Dcreate2(loc, path.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  }
  if (d < 0) return d;
  hid_t made = H5Dget_create_plist(d);
  std::string rewritten;
  for (int i = 0, n = H5Pget_nfilters(dcpl); i < n && rewritten.empty(); ++i) {
    unsigned flags = 0, want[16] = {}, got[16] = {}, config = 0;
    std::size_t nwant = 16, ngot = 16;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nwant, want, 0, nullptr, &config);
    const bool same =
        H5Pget_filter_by_id2(made, id, &flags, &ngot, got, 0, nullptr, &config) >= 0 &&
        ngot == nwant && std::equal(want, want + nwant, got);
    if (!same) rewritten = std::to_string(id);
  }
  H5Pclose(made);
  if (!rewritten.empty()) {
    H5Dclose(d);
    H5Ldelete(loc, path.c_str(), H5P_DEFAULT);
    throw std::runtime_error(
        what + ": create " + path +
        ": an HDF5 filter plugin loaded in this process rewrote filter " + rewritten +
        "'s parameters; the chunks are stored as they came and would not decode "
        "with them");
  }
  return d;
}

void u64_attribute(hid_t obj, const char* name, std::uint64_t value, const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(obj, name, H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_UINT64, &value) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(scalar);
  if (!ok) fail(what, std::string("write attribute ") + name);
}

std::optional<std::uint64_t> read_u64_attribute(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  std::uint64_t v = 0;
  const bool ok = attr >= 0 && H5Aread(attr, H5T_NATIVE_UINT64, &v) >= 0;
  if (attr >= 0) H5Aclose(attr);
  return ok ? std::optional(v) : std::nullopt;
}

std::string read_text_attribute(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return {};
  hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t type = vlen_text();
  char* p = nullptr;
  std::string out;
  if (attr >= 0 && H5Aread(attr, type, &p) >= 0 && p) out = p;
  if (p) H5free_memory(p);
  if (attr >= 0) H5Aclose(attr);
  H5Tclose(type);
  return out;
}

void write_value(hid_t file, const std::string& path, const stream2::Value& v,
                 const std::string& what) {
  make_parents(file, path, what);
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) != 0) return;  // the first value of a field stays
  using K = stream2::Value::Kind;
  hid_t scalar = H5Screate(H5S_SCALAR);
  switch (v.kind) {
    case K::unsigned_integer:
      dataset(file, path, H5T_STD_U64LE, H5T_NATIVE_UINT64, scalar, &v.u, what);
      break;
    case K::integer:
      dataset(file, path, H5T_STD_I64LE, H5T_NATIVE_INT64, scalar, &v.i, what);
      break;
    case K::real:
      dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &v.d, what);
      break;
    case K::boolean: {
      const std::uint8_t b = v.b;
      dataset(file, path, H5T_STD_U8LE, H5T_NATIVE_UINT8, scalar, &b, what);
      break;
    }
    case K::text: {
      const std::string s(v.s);
      const char* p = s.c_str();
      hid_t t = vlen_text();
      dataset(file, path, t, t, scalar, &p, what);
      H5Tclose(t);
      break;
    }
    case K::reals: {
      const hsize_t n = v.reals.size();
      hid_t space = H5Screate_simple(1, &n, nullptr);
      dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space, v.reals.data(), what);
      H5Sclose(space);
      break;
    }
    case K::texts: {
      std::vector<std::string> held(v.texts.begin(), v.texts.end());
      std::vector<const char*> ptrs;
      ptrs.reserve(held.size());
      for (const auto& s : held) ptrs.push_back(s.c_str());
      const hsize_t n = ptrs.size();
      hid_t space = H5Screate_simple(1, &n, nullptr);
      hid_t t = vlen_text();
      dataset(file, path, t, t, space, ptrs.data(), what);
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
        dataset(file, path, type, type, space, a.bytes.data(), what);
      } else {
        // Stored as the detector compressed it: one chunk, the whole array.
        make_parents(file, path, what);
        hid_t dcpl = chunked(static_cast<int>(dims.size()), dims.data(), a.compression,
                             dtype_size(a.dtype), what);
        hid_t d = create_as_declared(file, path, type, space, dcpl, what);
        H5Pclose(dcpl);
        const std::vector<hsize_t> zero(dims.size(), 0);
        const bool ok = d >= 0 && H5Dwrite_chunk(d, H5P_DEFAULT, 0, zero.data(), a.bytes.size(),
                                                 a.bytes.data()) >= 0;
        if (d >= 0) H5Dclose(d);
        if (!ok) {
          H5Sclose(space);
          H5Sclose(scalar);
          fail(what, "write " + path);
        }
      }
      H5Sclose(space);
      break;
    }
  }
  H5Sclose(scalar);
}

void text_field(hid_t file, const std::string& path, const std::string& value,
                const std::string& what) {
  hid_t t = vlen_text();
  hid_t scalar = H5Screate(H5S_SCALAR);
  const char* p = value.c_str();
  dataset(file, path, t, t, scalar, &p, what);
  H5Sclose(scalar);
  H5Tclose(t);
}

void attribute_on(hid_t file, const std::string& path, const char* name, const std::string& value,
                  const std::string& what) {
  hid_t o = H5Oopen(file, path.c_str(), H5P_DEFAULT);
  if (o < 0) fail(what, "open " + path);
  if (H5Aexists(o, name) > 0) H5Adelete(o, name);
  text_attribute(o, name, value, what);
  H5Oclose(o);
}

void vector_attribute(hid_t obj, const char* name, const double (&v)[3], const std::string& what) {
  const hsize_t n = 3;
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t attr = H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_DOUBLE, v) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  if (!ok) fail(what, std::string("write attribute ") + name);
}

// A scalar number `value` in `units` that is one step of a chain of NXtransformations: moved
// along (translation) `vector` by it, after `depends_on`.
void axis(hid_t file, const std::string& path, double value, const char* units,
          const double (&vector)[3], const double (&offset)[3], const std::string& depends_on,
          const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &value, what);
  H5Sclose(scalar);
  hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) fail(what, "open " + path);
  text_attribute(d, "units", units, what);
  text_attribute(d, "transformation_type", "translation", what);
  vector_attribute(d, "vector", vector, what);
  vector_attribute(d, "offset", offset, what);
  text_attribute(d, "offset_units", "m", what);
  text_attribute(d, "depends_on", depends_on, what);
  H5Dclose(d);
}

void int_pair(hid_t file, const std::string& path, std::int64_t a, std::int64_t b,
              const std::string& what) {
  const hsize_t n = 2;
  const std::int64_t v[2] = {a, b};
  hid_t space = H5Screate_simple(1, &n, nullptr);
  dataset(file, path, H5T_STD_I64LE, H5T_NATIVE_INT64, space, v, what);
  H5Sclose(space);
}

bool path_exists(hid_t f, const std::string& at) {
  std::size_t pos = 0;
  while ((pos = at.find('/', pos + 1)) != std::string::npos) {
    if (H5Lexists(f, at.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return H5Lexists(f, at.c_str(), H5P_DEFAULT) > 0;
}

void scalar_u64(hid_t file, const std::string& path, std::uint64_t v, const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  dataset(file, path, H5T_STD_U64LE, H5T_NATIVE_UINT64, scalar, &v, what);
  H5Sclose(scalar);
}

void scalar_f64(hid_t file, const std::string& path, double v, const char* units,
                const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &v, what);
  H5Sclose(scalar);
  if (units) attribute_on(file, path, "units", units, what);
}

void f64_array(hid_t file, const std::string& path, const std::vector<double>& v,
               const std::string& what) {
  const hsize_t n = v.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space, v.data(), what);
  H5Sclose(space);
}

// The images each of `datasets` holds in a data file left unfinished (a .part of a series given
// up), by dataset path; empty when it does not open.
std::map<std::string, hsize_t> extents_of(const std::string& file_path,
                                          const std::vector<std::string>& datasets) {
  std::map<std::string, hsize_t> out;
  hid_t f = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return out;
  for (const auto& at : datasets) {
    if (!path_exists(f, at)) continue;
    hid_t d = H5Dopen2(f, at.c_str(), H5P_DEFAULT);
    hid_t space = d >= 0 ? H5Dget_space(d) : -1;
    hsize_t dims[3] = {0, 0, 0};
    if (space >= 0 && H5Sget_simple_extent_ndims(space) >= 1 &&
        H5Sget_simple_extent_dims(space, dims, nullptr) >= 1) {
      out[at] = dims[0];
    }
    if (space >= 0) H5Sclose(space);
    if (d >= 0) H5Dclose(d);
  }
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

}  // namespace numastream::hdf5::detail
