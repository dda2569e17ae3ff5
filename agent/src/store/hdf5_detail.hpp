// What the agent's HDF5 writers and readers share (internal to the store layer): HDF5's error
// stack turned into one sentence, the dtype names' HDF5 types, groups made on the way to a path.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "detector/stream2.hpp"

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
void write_chunk(hid_t dset, int rank, const hsize_t* frame_dims, std::uint64_t& extent,
                 std::uint64_t index, const void* bytes, std::size_t size,
                 std::uint32_t filter_mask, const std::string& what);

// Opens `path` read-write to go on writing what a writer that died left (-1 when HDF5 cannot).
// HDF5 writes a dataset's chunk index before the superblock that records how far the file's
// space is allocated, so a writer killed between two flushes leaves chunks HDF5 then refuses to
// read or rewrite ("addr overflow"); every byte the file holds is taken as allocated (h5clear
// --increment=0 does the same), before anything past the recorded end is read.
hid_t open_to_resume(const std::string& path, hid_t fapl);

// The HDF5 LZ4 filter, whose framing lz4 frames carry.
constexpr H5Z_filter_t kLz4Filter = 32004;

// A variable-length UTF-8 text type (the caller closes it).
hid_t vlen_text();
// Attributes written on `obj`; a failure throws naming `what`.
void text_attribute(hid_t obj, const char* name, const std::string& value, const std::string& what);
void u64_attribute(hid_t obj, const char* name, std::uint64_t value, const std::string& what);
// An attribute read back: nullopt / "" when it is absent or unreadable.
std::optional<std::uint64_t> read_u64_attribute(hid_t obj, const char* name);
std::string read_text_attribute(hid_t obj, const char* name);
// The group at `path` (and those above it), with its NX_class.
void group(hid_t file, const std::string& path, const char* nx_class, const std::string& what);
// A dataset of `space` written at once from `data` of `mem_type` (the file type `file_type_id`).
void dataset(hid_t file, const std::string& path, hid_t file_type_id, hid_t mem_type, hid_t space,
             const void* data, const std::string& what);
// HDF5's filter plugins are not loaded while one lives (declaring a filter and creating a dataset
// with it load its plugin when one is installed).
class PluginsOff {
 public:
  PluginsOff();
  ~PluginsOff();
  PluginsOff(const PluginsOff&) = delete;
  PluginsOff& operator=(const PluginsOff&) = delete;

 private:
  unsigned state_ = 0;
  bool known_;
};
// The creation properties of a dataset chunked by `chunk`, declaring the filter its chunks carry
// (the caller closes them).
hid_t chunked(int rank, const hsize_t* chunk, stream2::Compression c, std::size_t elem,
              const std::string& what);
// A dataset created with `dcpl`'s filters declared exactly as given, for chunks written as they
// came (direct chunk I/O). HDF5's filter plugins are not loaded meanwhile: a plugin's set_local
// rewrites the declared parameters (Debian's bitshuffle 0.3 plugin, installed beside DIALS,
// rewrote 32008's into ones no reader decodes our chunks with). Throws, naming the filter, when a
// filter already loaded in the process rewrote them anyway. Returns < 0 when HDF5 fails.
hid_t create_as_declared(hid_t loc, const std::string& path, hid_t type, hid_t space, hid_t dcpl,
                         const std::string& what);
// One field of a Stream V2 message at `path` in its HDF5 form: numbers and text as scalars,
// lists as 1-d datasets, typed arrays with their shape (compressed ones stored as the detector
// compressed them, one chunk). A path that exists already keeps its first value.
void write_value(hid_t file, const std::string& path, const stream2::Value& v,
                 const std::string& what);

// NeXus's pieces, each written at once: a text dataset, a text attribute on the object at `path`
// (replacing one of that name), a 3-vector attribute, a 2-integer dataset, scalars (a double with
// its units, when given) and a 1-d array of doubles.
void text_field(hid_t file, const std::string& path, const std::string& value,
                const std::string& what);
void attribute_on(hid_t file, const std::string& path, const char* name, const std::string& value,
                  const std::string& what);
void vector_attribute(hid_t obj, const char* name, const double (&v)[3], const std::string& what);
void int_pair(hid_t file, const std::string& path, std::int64_t a, std::int64_t b,
              const std::string& what);
void scalar_u64(hid_t file, const std::string& path, std::uint64_t v, const std::string& what);
void scalar_f64(hid_t file, const std::string& path, double v, const char* units,
                const std::string& what);
void f64_array(hid_t file, const std::string& path, const std::vector<double>& v,
               const std::string& what);
// A scalar number `value` in `units` that is one step of a chain of NXtransformations: moved
// along (translation) `vector` by it, after `depends_on`.
void axis(hid_t file, const std::string& path, double value, const char* units,
          const double (&vector)[3], const double (&offset)[3], const std::string& depends_on,
          const std::string& what);
// Every link on the way to `at` exists in `f`.
bool path_exists(hid_t f, const std::string& at);
// The images each of `datasets` holds in a data file left unfinished (a .part of a series given
// up), by dataset path; empty when it does not open.
std::map<std::string, hsize_t> extents_of(const std::string& file_path,
                                          const std::vector<std::string>& datasets);

}  // namespace numastream::hdf5::detail
