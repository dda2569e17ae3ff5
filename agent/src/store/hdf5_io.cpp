#include "store/hdf5_io.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "codec/bitshuffle.hpp"
#include "store/direct_io.hpp"
#include "store/hdf5_detail.hpp"

namespace numastream::hdf5 {

using namespace detail;

std::size_t FrameShape::frame_bytes() const {
  std::size_t n = dtype_size(dtype);
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

Reader::Reader(const std::string& path, const std::string& dataset) : what_(path + ":" + dataset) {
  quiet();
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) fail(what_, "open the file");
  dset_ = H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT);
  if (dset_ < 0) fail(what_, "open the dataset");
  space_ = H5Dget_space(dset_);
  const int rank = H5Sget_simple_extent_ndims(space_);
  if (rank < 2 || rank > 3) {
    throw std::runtime_error(
        what_ + ": a dataset of frames has 2 or 3 dimensions (frames x [rows x] cols), this one " +
        std::to_string(rank));
  }
  hsize_t dims[3];
  H5Sget_simple_extent_dims(space_, dims, nullptr);
  frames_ = dims[0];
  shape_.dims.assign(dims + 1, dims + rank);
  type_ = H5Dget_type(dset_);
  shape_.dtype = dtype_of(type_);
  if (shape_.dtype.empty()) {
    throw std::runtime_error(what_ +
                             ": pixels must be little-endian integers or floats of 1 to 8 bytes");
  }
  // Pass-through: chunks of exactly one frame, the bitshuffle filter with LZ4 the only filter.
  hid_t dcpl = H5Dget_create_plist(dset_);
  if (H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_nfilters(dcpl) == 1) {
    hsize_t chunk[3];
    H5Pget_chunk(dcpl, rank, chunk);
    bool one_frame = chunk[0] == 1;
    for (int i = 1; i < rank; ++i) one_frame = one_frame && chunk[i] == dims[i];
    unsigned flags = 0, cd[8] = {};
    std::size_t ncd = 8;
    char name[64];
    H5Z_filter_t id = H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, sizeof(name), name, nullptr);
    bool lz4 = ncd >= 5 && cd[4] == bslz4::kHdf5CompressLz4;
    if (one_frame && id == static_cast<H5Z_filter_t>(bslz4::kHdf5FilterId) && lz4)
      stored_ = Stored::bslz4;
  }
  H5Pclose(dcpl);
}

Reader::~Reader() {
  quiet();
  if (type_ >= 0) H5Tclose(type_);
  if (space_ >= 0) H5Sclose(space_);
  if (dset_ >= 0) H5Dclose(dset_);
  if (file_ >= 0) H5Fclose(file_);
}

std::string Reader::layout() const {
  std::string dims;
  for (auto d : shape_.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
  return std::to_string(frames_) + " frames of " + dims + " " + shape_.dtype +
         (stored_ == Stored::bslz4 ? ", bslz4 chunks of one frame (sent as stored)"
                                   : ", read as pixels");
}

std::size_t Reader::max_read_bytes() const noexcept {
  return stored_ == Stored::bslz4 ? bslz4::max_encoded_size(shape_.frame_bytes())
                                  : shape_.frame_bytes();
}

std::size_t Reader::read_frame(std::uint64_t index, std::span<std::byte> out) {
  const int rank = static_cast<int>(shape_.dims.size()) + 1;
  hsize_t offset[3] = {index, 0, 0};
  if (stored_ == Stored::bslz4) {
    hsize_t size = 0;
    if (H5Dget_chunk_storage_size(dset_, offset, &size) < 0)
      fail(what_, "size of frame " + std::to_string(index));
    if (size > out.size()) {
      throw std::runtime_error(what_ + ": frame " + std::to_string(index) + " is stored in " +
                               std::to_string(size) + " bytes, more than a bslz4 frame of " +
                               std::to_string(shape_.frame_bytes()) + " bytes can take");
    }
    std::uint32_t mask = 0;
    if (H5Dread_chunk(dset_, H5P_DEFAULT, offset, &mask, out.data()) < 0) {
      fail(what_, "read frame " + std::to_string(index));
    }
    if (mask != 0) {
      throw std::runtime_error(what_ + ": frame " + std::to_string(index) +
                               " is stored unfiltered (filter mask " + std::to_string(mask) + ")");
    }
    return static_cast<std::size_t>(size);
  }
  const std::size_t bytes = shape_.frame_bytes();
  if (bytes > out.size()) throw std::runtime_error(what_ + ": a frame is larger than the buffer");
  hsize_t count[3] = {1, shape_.dims[0], rank == 3 ? shape_.dims[1] : 1};
  hid_t mem = H5Screate_simple(rank, count, nullptr);
  hid_t file_space = H5Scopy(space_);
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, offset, nullptr, count, nullptr);
  hid_t mem_type = H5Tcopy(type_);
  herr_t rc = H5Dread(dset_, mem_type, mem, file_space, H5P_DEFAULT, out.data());
  H5Tclose(mem_type);
  H5Sclose(file_space);
  H5Sclose(mem);
  if (rc < 0) fail(what_, "read frame " + std::to_string(index) + " (a filter HDF5 cannot load?)");
  return bytes;
}

Writer::Writer(const std::string& path, const std::string& dataset, const FrameShape& shape,
               bool bslz4, bool resume, bool direct)
    : what_(path + ":" + dataset), shape_(shape) {
  quiet();
  struct Fapl {
    hid_t id;
    ~Fapl() {
      if (id >= 0) H5Pclose(id);
    }
  } fapl{file_access(direct)};
  if (fapl.id < 0) fail(what_, "set up the file driver");
  const std::size_t elem = dtype_size(shape.dtype);
  if (elem == 0) throw std::runtime_error(what_ + ": unknown dtype \"" + shape.dtype + "\"");
  if (shape.dims.empty() || shape.dims.size() > 2) {
    throw std::runtime_error(what_ + ": a frame has 1 or 2 dimensions");
  }
  const int rank = static_cast<int>(shape.dims.size()) + 1;
  if (resume && H5Fis_hdf5(path.c_str()) <= 0) {
    // The file holds frames an earlier receiver acknowledged: recreating it would destroy them.
    throw std::runtime_error(
        what_ +
        ": cannot be resumed (not a readable HDF5 file); it holds frames an earlier "
        "receiver acknowledged and is left as it is: move it aside to start the stream's file "
        "anew");
  }
  if (resume) {
    file_ = open_to_resume(path, fapl.id);
    if (file_ >= 0 && H5Lexists(file_, dataset.c_str(), H5P_DEFAULT) > 0) {
      dset_ = H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT);
    }
    if (dset_ >= 0) {
      hid_t space = H5Dget_space(dset_);
      hsize_t dims[3] = {};
      H5Sget_simple_extent_dims(space, dims, nullptr);
      extent_ = dims[0];
      written_ = frames_written(dset_, what_);  // the frames the file holds
      H5Sclose(space);
      return;
    }
    if (file_ >= 0) H5Fclose(file_);
    file_ = -1;
    throw std::runtime_error(
        what_ +
        ": cannot be resumed (the file does not open read-write or has no such dataset); "
        "it holds frames an earlier receiver acknowledged and is left as it is");
  }
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id);
  if (file_ < 0) fail(what_, "create the file");
  make_parents(file_, dataset, what_);
  hsize_t dims[3] = {0, shape.dims[0], rank == 3 ? shape.dims[1] : 0};
  hsize_t max[3] = {H5S_UNLIMITED, dims[1], dims[2]};
  hsize_t chunk[3] = {1, dims[1], dims[2]};
  hid_t space = H5Screate_simple(rank, dims, max);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, rank, chunk);
  if (bslz4) {
    PluginsOff off;
    // What the bitshuffle filter records: its version (0.4), the element size, block size 0
    // (the library's default), LZ4. Optional: HDF5 need not have the filter to store our chunks.
    const unsigned cd[5] = {0, 4, static_cast<unsigned>(elem), 0, bslz4::kHdf5CompressLz4};
    if (H5Pset_filter(dcpl, static_cast<H5Z_filter_t>(bslz4::kHdf5FilterId), H5Z_FLAG_OPTIONAL, 5,
                      cd) < 0) {
      fail(what_, "declare the bitshuffle filter");
    }
  }
  try {
    dset_ = create_as_declared(file_, dataset, file_type(shape.dtype), space, dcpl, what_);
  } catch (...) {
    H5Pclose(dcpl);
    H5Sclose(space);
    throw;
  }
  H5Pclose(dcpl);
  H5Sclose(space);
  if (dset_ < 0) fail(what_, "create the dataset");
}

Writer::~Writer() {
  try {
    close();
  } catch (...) {
  }
}

void Writer::write_frame(std::uint64_t index, std::span<const std::byte> bytes, Stored stored) {
  if (stored == Stored::raw && bytes.size() != shape_.frame_bytes()) {
    throw std::runtime_error(what_ + ": frame " + std::to_string(index) + " has " +
                             std::to_string(bytes.size()) + " bytes; a frame of this dataset has " +
                             std::to_string(shape_.frame_bytes()));
  }
  const hsize_t frame_dims[2] = {shape_.dims[0], shape_.dims.size() > 1 ? shape_.dims[1] : 0};
  const std::uint32_t mask = stored == Stored::bslz4 ? 0u : 1u;  // bit 0: the filter was skipped
  write_chunk(dset_, static_cast<int>(shape_.dims.size()) + 1, frame_dims, extent_, index,
              bytes.data(), bytes.size(), mask, what_);
  written_.insert(index);
}

bool Writer::direct() const { return file_ >= 0 && written_direct(file_); }

void Writer::flush() {
  quiet();
  if (file_ >= 0 && H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(what_, "flush");
}

void Writer::close() {
  quiet();
  if (dset_ >= 0) H5Dclose(dset_);
  dset_ = -1;
  if (file_ >= 0 && H5Fclose(file_) < 0) {
    file_ = -1;
    fail(what_, "close");
  }
  file_ = -1;
}

}  // namespace numastream::hdf5
