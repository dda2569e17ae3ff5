#include "store/series_file.hpp"

#include <hdf5.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "base/error.hpp"
#include "base/log.hpp"
#include "codec/bitshuffle.hpp"
#include "codec/dtype.hpp"
#include "store/direct_io.hpp"
#include "store/hdf5_detail.hpp"
#include "store/undo_journal.hpp"

namespace numastream::hdf5 {

using namespace detail;

namespace {

constexpr const char* kDetector = "/entry/instrument/detector/";

// The sequences a file holds (its /entry/numastream/sequences), or nullopt without them.
std::optional<std::vector<std::uint64_t>> read_sequences(hid_t file) {
  if (H5Lexists(file, "/entry/numastream", H5P_DEFAULT) <= 0 ||
      H5Lexists(file, "/entry/numastream/sequences", H5P_DEFAULT) <= 0) {
    return std::nullopt;
  }
  hid_t d = H5Dopen2(file, "/entry/numastream/sequences", H5P_DEFAULT);
  if (d < 0) return std::nullopt;
  hid_t space = H5Dget_space(d);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<std::uint64_t> out(n);
  const bool ok =
      n == 0 || H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0;
  H5Sclose(space);
  H5Dclose(d);
  return ok ? std::optional(std::move(out)) : std::nullopt;
}

constexpr const char* kNumastream = "/entry/numastream";
constexpr const char* kSequences = "/entry/numastream/sequences";

}  // namespace

// One image's time (seconds, from the image message's start_time, stop_time or real_time) at
// `index` of the 1-d dataset `name` under the detector, made (with the detector's groups) at the
// first: extended as images come in any order, NaN where an image has not come.
static void store_time(hid_t file, const std::string& name, std::uint64_t index, double seconds,
                       const std::string& series_date, const std::string& what) {
  for (const auto& [g, cls] : {std::pair{"/entry/instrument", "NXinstrument"},
                               {"/entry/instrument/detector", "NXdetector"}}) {
    if (H5Lexists(file, g, H5P_DEFAULT) <= 0) group(file, g, cls, what);
  }
  const std::string path = std::string(kDetector) + name;
  hid_t d = -1;
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0) {
    d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  } else {
    hsize_t dims = 0, max = H5S_UNLIMITED, chunk = 1024;
    hid_t space = H5Screate_simple(1, &dims, &max);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    const double nan = std::nan("");
    H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan);
    d = H5Dcreate2(file, path.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(space);
    if (d >= 0) {
      text_attribute(d, "units", "s", what);
      if (!series_date.empty()) text_attribute(d, "start", series_date, what);
    }
  }
  if (d < 0) fail(what, "create " + path);
  hid_t space = H5Dget_space(d);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  H5Sclose(space);
  bool ok = true;
  if (index >= n) {
    const hsize_t size = index + 1;
    ok = H5Dset_extent(d, &size) >= 0;
  }
  if (ok) {
    space = H5Dget_space(d);
    const hsize_t at = index, one = 1;
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &at, nullptr, &one, nullptr);
    hid_t mem = H5Screate_simple(1, &one, nullptr);
    ok = H5Dwrite(d, H5T_NATIVE_DOUBLE, mem, space, H5P_DEFAULT, &seconds) >= 0;
    H5Sclose(mem);
    H5Sclose(space);
  }
  H5Dclose(d);
  if (!ok) fail(what, "write " + path);
}

namespace {

// A series file is written with an undo journal: a flush a kill interrupted is undone before the
// file is read (the file as its last complete flush left it, every message it acknowledged in it).
void roll_back_if_torn(const std::string& path) {
  if (const std::string undone = UndoJournal::roll_back(path); !undone.empty()) log_warn(undone);
}

}  // namespace

SeriesFile::SeriesFile(const std::string& path, std::uint32_t stream_id, bool direct)
    : path_(path) {
  create(stream_id, direct, true);
  take_name();
}

SeriesFile::SeriesFile(const std::string& path, std::uint32_t stream_id, bool direct,
                       const DataPart& part)
    : path_(path), part_(part) {
  if (part.capacity == 0)
    throw std::invalid_argument(path + ": a data file holds at least one image");
  create(stream_id, direct, false);
  hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
  u64_attribute(entry, "series_id", part.series_id, path_);
  text_attribute(entry, "series_unique_id", part.series_unique_id, path_);
  H5Gclose(entry);
  hid_t g = H5Gopen2(file_, kNumastream, H5P_DEFAULT);
  u64_attribute(g, "first_image", part.first_image, path_);
  u64_attribute(g, "capacity", part.capacity, path_);
  H5Gclose(g);
  take_name();
}

// A new file is made under a name of its own and takes its name only once its structure is on
// disk: a gateway killed while HDF5 writes a file's first metadata leaves that temporary file
// (never a message in it, never acknowledged; the next file made at this name replaces it), not a
// file at the name that the next gateway cannot reopen.
std::string SeriesFile::creating_name() const { return path_ + ".new"; }

void SeriesFile::take_name() {
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(creating_name(), "flush");
  if (std::rename(creating_name().c_str(), path_.c_str()) != 0)
    fail(path_, "rename " + creating_name() + " to it: " + errno_text(errno));
}

void SeriesFile::create(std::uint32_t stream_id, bool direct, bool detector) {
  quiet();
  const hid_t fapl = file_access(direct, true);
  if (fapl < 0) fail(path_, "set up the file driver");
  file_ = H5Fcreate(creating_name().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (file_ < 0) fail(creating_name(), "create the file");
  group(file_, "/entry", "NXentry", path_);
  group(file_, "/entry/data", "NXdata", path_);
  if (detector) {
    group(file_, "/entry/instrument", "NXinstrument", path_);
    group(file_, "/entry/instrument/detector", "NXdetector", path_);
  }
  group(file_, kNumastream, "NXcollection", path_);
  hsize_t dims = 0, max = H5S_UNLIMITED, chunk = 1024;
  hid_t space = H5Screate_simple(1, &dims, &max);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  sequences_ = H5Dcreate2(file_, kSequences, H5T_STD_U64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(space);
  if (sequences_ < 0) fail(path_, std::string("create ") + kSequences);
  hid_t g = H5Gopen2(file_, kNumastream, H5P_DEFAULT);
  u64_attribute(g, "stream_id", stream_id, path_);
  H5Gclose(g);
}

std::unique_ptr<SeriesFile> SeriesFile::reopen(const std::string& path, bool direct) {
  quiet();
  roll_back_if_torn(path);
  const std::string left =
      " It may hold messages an earlier gateway acknowledged and is left as it is: move it aside "
      "to "
      "write the series anew";
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw std::runtime_error(path + ": cannot be resumed (not a readable HDF5 file)." + left);
  std::unique_ptr<SeriesFile> f(new SeriesFile());
  f->path_ = path;
  const hid_t fapl = file_access(direct, true);
  if (fapl < 0) fail(path, "set up the file driver");
  f->file_ = open_to_resume(path, fapl);
  H5Pclose(fapl);
  if (f->file_ < 0)
    throw std::runtime_error(path + ": cannot be resumed (it does not open read-write)." + left);
  // Every object it links reads back (what h5ls -r and h5dump walk): a write torn by a kill can
  // leave a group naming an object that was never written.
  if (H5Ovisit2(
          f->file_, H5_INDEX_NAME, H5_ITER_INC,
          [](hid_t, const char*, const H5O_info_t*, void*) -> herr_t { return 0; }, nullptr,
          H5O_INFO_BASIC) < 0) {
    throw std::runtime_error(path + ": cannot be resumed (its objects do not all read back)." +
                             left);
  }
  const auto seqs = read_sequences(f->file_);
  if (!seqs) throw std::runtime_error(path + ": cannot be resumed (no " + kSequences + ")." + left);
  f->held_.insert(seqs->begin(), seqs->end());
  f->stored_ = seqs->size();
  f->read_record();
  f->read_channels(left);
  return f;
}

void SeriesFile::read_record() {
  sequences_ = H5Dopen2(file_, kSequences, H5P_DEFAULT);
  hid_t g = H5Gopen2(file_, kNumastream, H5P_DEFAULT);
  start_sequence_ = read_u64_attribute(g, "start_sequence");
  end_sequence_ = read_u64_attribute(g, "end_sequence");
  const auto first = read_u64_attribute(g, "first_image"),
             capacity = read_u64_attribute(g, "capacity");
  H5Gclose(g);
  if (first && capacity) {
    DataPart part;
    part.first_image = *first;
    part.capacity = *capacity;
    hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
    part.series_id = read_u64_attribute(entry, "series_id").value_or(0);
    part.series_unique_id = read_text_attribute(entry, "series_unique_id");
    H5Gclose(entry);
    part_ = part;
  }
  const std::string start = std::string(kDetector) + "stream2_start";
  if (H5Lexists(file_, start.c_str(), H5P_DEFAULT) > 0) {
    hid_t d = H5Dopen2(file_, start.c_str(), H5P_DEFAULT);
    hid_t space = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    start_message_.resize(n);
    const bool ok =
        H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, start_message_.data()) >= 0;
    H5Sclose(space);
    H5Dclose(d);
    if (!ok) fail(path_, "read " + start);
  }
}

void SeriesFile::read_channels(const std::string& left) {
  // The channels: their shape, type and compression, and the images each holds.
  hid_t data = H5Gopen2(file_, "/entry/data", H5P_DEFAULT);
  if (data < 0) fail(path_, "open /entry/data");
  H5G_info_t info{};
  H5Gget_info(data, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256] = {};
    if (H5Lget_name_by_idx(data, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof(name),
                           H5P_DEFAULT) < 0)
      continue;
    if (part_ && std::string(name) == "data") continue;  // the first channel's second name
    Channel c;
    c.dset = H5Dopen2(data, name, H5P_DEFAULT);
    if (c.dset < 0) {  // a link to a dataset a torn write left unfinished
      H5Gclose(data);
      throw std::runtime_error(path_ + ": cannot be resumed (/entry/data/" + name +
                               " does not open)." + left);
    }
    hid_t space = H5Dget_space(c.dset);
    hsize_t dims[3] = {};
    const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
    H5Sclose(space);
    c.extent = dims[0];
    for (int r = 1; r < rank; ++r) c.dims.push_back(dims[r]);
    hid_t type = H5Dget_type(c.dset);
    c.dtype = dtype_of(type);
    H5Tclose(type);
    hid_t dcpl = H5Dget_create_plist(c.dset);
    if (H5Pget_nfilters(dcpl) > 0) {
      unsigned flags = 0;
      size_t ncd = 0;
      const H5Z_filter_t id = H5Pget_filter2(dcpl, 0, &flags, &ncd, nullptr, 0, nullptr, nullptr);
      c.compression = id == static_cast<H5Z_filter_t>(bslz4::kHdf5FilterId)
                          ? stream2::Compression::bslz4
                      : id == kLz4Filter ? stream2::Compression::lz4
                                         : stream2::Compression::none;
    }
    H5Pclose(dcpl);
    const std::uint64_t offset = part_ ? part_->first_image : 0;
    std::set<std::uint64_t> frames;
    try {
      frames = frames_written(c.dset, path_ + ":/entry/data/" + name);
    } catch (...) {
      // A chunk index a torn write broke: the file is refused, and closed whole (the group and
      // dataset open here would hold it open in this process, which goes on with the series).
      H5Dclose(c.dset);
      H5Gclose(data);
      throw;
    }
    for (const std::uint64_t index : frames) written_[name].insert(offset + index);
    channels_.emplace(name, std::move(c));
  }
  H5Gclose(data);
}

std::optional<SeriesFile::Identity> SeriesFile::identify(const std::string& path) {
  quiet();
  try {
    roll_back_if_torn(path);
  } catch (const std::exception& e) {
    log_warn(e.what());
    return std::nullopt;
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) return std::nullopt;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return std::nullopt;
  std::optional<Identity> out;
  hid_t entry =
      H5Lexists(file, "/entry", H5P_DEFAULT) > 0 ? H5Gopen2(file, "/entry", H5P_DEFAULT) : -1;
  if (entry >= 0) {
    if (const auto id = read_u64_attribute(entry, "series_id")) {
      out.emplace();
      out->series_id = *id;
      out->series_unique_id = read_text_attribute(entry, "series_unique_id");
      out->marked_incomplete = H5Aexists(entry, "incomplete") > 0;
      if (const auto seqs = read_sequences(file)) {
        out->sequences.insert(seqs->begin(), seqs->end());
        hid_t g = H5Gopen2(file, kNumastream, H5P_DEFAULT);
        if (const auto stream = read_u64_attribute(g, "stream_id"))
          out->stream_id = static_cast<std::uint32_t>(*stream);
        H5Gclose(g);
      }
    }
    H5Gclose(entry);
  }
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

bool SeriesFile::records_nothing(const std::string& path) {
  quiet();
  if (H5Fis_hdf5(path.c_str()) <= 0) return false;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return false;
  const auto seqs = read_sequences(file);
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
  return seqs && seqs->empty();
}

bool SeriesFile::direct() const { return file_ >= 0 && written_direct(file_); }

SeriesFile::~SeriesFile() {
  try {
    close();
  } catch (...) {
  }
}

std::vector<std::string> SeriesFile::write_start(std::span<const std::byte> message,
                                                 std::uint64_t series_id,
                                                 const std::string& series_unique_id,
                                                 std::uint64_t sequence) {
  std::vector<std::string> skipped;
  std::string error;
  if (!stream2::walk(
          message, [&](const std::string& p, const stream2::Value& v) { write_field(p, v); },
          skipped, error)) {
    throw std::runtime_error(path_ + ": the start message: " + error);
  }
  // A gateway killed before it recorded the start message may have written it: written anew.
  const std::string start = std::string(kDetector) + "stream2_start";
  if (H5Lexists(file_, start.c_str(), H5P_DEFAULT) > 0)
    H5Ldelete(file_, start.c_str(), H5P_DEFAULT);
  const hsize_t n = message.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  dataset(file_, start, H5T_STD_U8LE, H5T_NATIVE_UINT8, space, message.data(), path_);
  H5Sclose(space);
  hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
  for (const char* a : {"series_id", "series_unique_id"})
    if (H5Aexists(entry, a) > 0) H5Adelete(entry, a);
  hid_t scalar = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(entry, "series_id", H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_UINT64, &series_id) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(scalar);
  if (ok) text_attribute(entry, "series_unique_id", series_unique_id, path_);
  H5Gclose(entry);
  if (!ok) fail(path_, "write attribute series_id");
  hid_t g = H5Gopen2(file_, kNumastream, H5P_DEFAULT);
  if (H5Aexists(g, "start_sequence") > 0) H5Adelete(g, "start_sequence");
  u64_attribute(g, "start_sequence", sequence, path_);
  H5Gclose(g);
  start_sequence_ = sequence;
  return skipped;
}

void SeriesFile::write_end(std::uint64_t sequence) {
  hid_t g = H5Gopen2(file_, kNumastream, H5P_DEFAULT);
  if (H5Aexists(g, "end_sequence") > 0) H5Adelete(g, "end_sequence");
  u64_attribute(g, "end_sequence", sequence, path_);
  H5Gclose(g);
  end_sequence_ = sequence;
}

void SeriesFile::write_field(const std::string& field, const stream2::Value& v) {
  write_value(file_, kDetector + field, v, path_);
}

SeriesFile::Channel& SeriesFile::channel(const std::string& name, const stream2::Array& a) {
  auto it = channels_.find(name);
  if (it != channels_.end()) {
    const Channel& c = it->second;
    if (c.dims != a.dims || c.dtype != a.dtype || c.compression != a.compression) {
      throw std::runtime_error(path_ + ": channel " + name + ": an image of " + a.dtype + " " +
                               stream2::compression_name(a.compression) +
                               " differs from the channel's first image (" + c.dtype + " " +
                               stream2::compression_name(c.compression) + ")");
    }
    return it->second;
  }
  if (a.dims.empty() || a.dims.size() > 2) {
    throw std::runtime_error(path_ + ": channel " + name +
                             ": an image has 1 or 2 dimensions, this one " +
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
  try {
    c.dset = create_as_declared(file_, path, file_type(a.dtype), space, dcpl, path_);
  } catch (...) {
    H5Pclose(dcpl);
    H5Sclose(space);
    throw;
  }
  H5Pclose(dcpl);
  H5Sclose(space);
  if (c.dset < 0) fail(path_, "create " + path);
  if (part_) {  // counted from 1, as DECTRIS's data files; image_nr_high again at close if short
    u64_attribute(c.dset, "image_nr_low", part_->first_image + 1, path_);
    u64_attribute(c.dset, "image_nr_high", part_->first_image + part_->capacity, path_);
  }
  if (channels_.empty()) {
    hid_t g = H5Gopen2(file_, "/entry/data", H5P_DEFAULT);
    // A data file's first channel is also /entry/data/data: what readers of DECTRIS's files open.
    const bool alias = part_ && name != "data";
    if (alias && H5Lcreate_hard(file_, path.c_str(), g, "data", H5P_DEFAULT, H5P_DEFAULT) < 0) {
      H5Gclose(g);
      fail(path_, "link /entry/data/data to " + path);
    }
    text_attribute(g, "signal", alias ? "data" : name, path_);
    H5Gclose(g);
  }
  return channels_.emplace(name, std::move(c)).first->second;
}

void SeriesFile::write_image(std::span<const std::byte> message, std::uint64_t image_id) {
  std::vector<std::string> skipped;
  std::string error;
  std::map<std::string, double> times;  // start_time, stop_time, real_time: rationals, in seconds
  std::string series_date;
  const bool ok = stream2::walk(
      message,
      [&](const std::string& p, const stream2::Value& v) {
        using K = stream2::Value::Kind;
        if ((p == "start_time" || p == "stop_time" || p == "real_time") && v.kind == K::reals &&
            v.reals.size() == 2 && v.reals[1] > 0) {
          times[p] = v.reals[0] / v.reals[1];
          return;
        }
        if (p == "series_date" && v.kind == K::text) series_date = std::string(v.s);
        if (p.rfind("data/", 0) != 0 || v.kind != stream2::Value::Kind::array) return;
        const std::string name = p.substr(5);
        Channel& c = channel(name, v.array);
        const hsize_t frame[2] = {c.dims[0], c.dims.size() > 1 ? c.dims[1] : 0};
        const std::uint64_t first = part_ ? part_->first_image : 0;
        if (image_id < first || (part_ && image_id - first >= part_->capacity)) {
          throw std::runtime_error(path_ + ": image " + std::to_string(image_id) +
                                   " is not one of this data file's (" + std::to_string(first) +
                                   " to " + std::to_string(first + part_->capacity - 1) + ")");
        }
        write_chunk(c.dset, static_cast<int>(c.dims.size()) + 1, frame, c.extent, image_id - first,
                    v.array.bytes.data(), v.array.bytes.size(), 0, path_ + ":/entry/data/" + name);
        written_[name].insert(image_id);
      },
      skipped, error);
  if (!ok) throw std::runtime_error(path_ + ": image " + std::to_string(image_id) + ": " + error);
  const std::uint64_t first = part_ ? part_->first_image : 0;
  for (const auto& [name, seconds] : times)
    store_time(file_, name, image_id - first, seconds, series_date, path_);
}

void SeriesFile::mark_missing(const std::string& missing) {
  if (file_ < 0) return;
  hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
  if (entry < 0) fail(path_, "open /entry");
  if (H5Aexists(entry, "incomplete") > 0) H5Adelete(entry, "incomplete");
  text_attribute(entry, "incomplete", missing, path_);
  H5Gclose(entry);
}

// The sequences recorded since the last flush, appended to /entry/numastream/sequences.
void SeriesFile::store_sequences() {
  if (pending_.empty() || sequences_ < 0) return;
  const hsize_t n = pending_.size(), size = stored_ + n;
  if (H5Dset_extent(sequences_, &size) < 0) fail(path_, std::string("extend ") + kSequences);
  hid_t space = H5Dget_space(sequences_);
  const hsize_t at = stored_;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &at, nullptr, &n, nullptr);
  hid_t mem = H5Screate_simple(1, &n, nullptr);
  const bool ok =
      H5Dwrite(sequences_, H5T_NATIVE_UINT64, mem, space, H5P_DEFAULT, pending_.data()) >= 0;
  H5Sclose(mem);
  H5Sclose(space);
  if (!ok) fail(path_, std::string("write ") + kSequences);
  stored_ = size;
  pending_.clear();
}

void SeriesFile::flush() {
  quiet();
  if (file_ < 0) return;
  // What the messages wrote first, then the record of them: a gateway killed in the middle of a
  // flush must never leave a file whose record names a message it does not hold (the next
  // gateway would take it for a retransmission and the image would be missing). HDF5 writes a
  // flush's metadata (the images' chunk index, the record's extent) in an order of its own, so the
  // record is stored only once what it names is in the file.
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(path_, "flush");
  if (pending_.empty()) return;
  store_sequences();
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(path_, "flush");
}

void SeriesFile::close() {
  quiet();
  if (file_ >= 0 && !pending_.empty()) {
    // As in flush(): the messages' writes are in the file before the record of them.
    if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(path_, "flush");
    store_sequences();
  }
  if (sequences_ >= 0) H5Dclose(sequences_);
  sequences_ = -1;
  for (auto& [name, c] : channels_) {
    // The last image it holds, counted from 1 (DECTRIS's data files): written at its creation
    // for a whole file, so that closing a whole file writes no metadata a kill could tear.
    if (part_ && c.dset >= 0 && c.extent != part_->capacity) {
      if (H5Aexists(c.dset, "image_nr_high") > 0) H5Adelete(c.dset, "image_nr_high");
      u64_attribute(c.dset, "image_nr_high", part_->first_image + c.extent, path_);
    }
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
