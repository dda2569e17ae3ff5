// HDF5 frames in and out with direct chunk I/O (libhdf5): a dataset of frames x rows x cols,
// chunked one frame per chunk. Frames stored with the bitshuffle filter (32008) are read and
// written as the bytes of their chunk: never decompressed to be stored or sent. One thread of a
// process works with HDF5 (the sender's source, the receiver's sink; another may close what it
// opened): Debian's libhdf5 is built thread-safe (H5_HAVE_THREADSAFE), which serialises every
// call behind one lock, so threads gain nothing, and keeps an error stack per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "codec/dtype.hpp"

namespace numastream::hdf5 {

struct FrameShape {
  std::string dtype = "uint16";     // dtype.hpp
  std::vector<std::uint64_t> dims;  // of one frame: {rows, cols} (or {n} for 1-D frames)
  std::size_t frame_bytes() const;
};

enum class Stored { raw, bslz4 };

class Reader {
 public:
  // Throws std::runtime_error naming the file and dataset when either cannot be read as frames.
  Reader(const std::string& path, const std::string& dataset);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  std::uint64_t frames() const noexcept { return frames_; }
  const FrameShape& shape() const noexcept { return shape_; }
  // bslz4: the dataset's only filter is bitshuffle+LZ4 and a chunk is one frame; frames are read
  // as their stored bytes. raw: anything else, read (and decoded by HDF5's filters) as pixels.
  Stored stored() const noexcept { return stored_; }
  std::string layout() const;  // for the log: chunking and filters
  // Largest read_frame() result: the frame's bytes (raw) or its stored chunk's bound (bslz4).
  std::size_t max_read_bytes() const noexcept;
  // Frame `index` into `out`; returns the bytes written.
  std::size_t read_frame(std::uint64_t index, std::span<std::byte> out);

 private:
  std::string what_;
  long long file_ = -1, dset_ = -1, space_ = -1, type_ = -1;
  std::uint64_t frames_ = 0;
  FrameShape shape_;
  Stored stored_ = Stored::raw;
};

class Writer {
 public:
  // Creates `path` (or, with `resume`, opens it: one that does not open with the dataset throws,
  // naming it, and is never recreated: it holds acknowledged frames) with
  // `dataset` of frames x shape, one frame per chunk, declared with the bitshuffle filter when
  // `bslz4` (frames then arrive as bslz4 chunks). Parent groups are created. `direct`: written
  // past the page cache where the filesystem allows (direct_io.hpp).
  Writer(const std::string& path, const std::string& dataset, const FrameShape& shape, bool bslz4,
         bool resume, bool direct = false);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Whether the file is written past the page cache (asked for and allowed by its filesystem).
  bool direct() const;
  // Frames already in the file (a resumed file).
  const std::set<std::uint64_t>& written() const noexcept { return written_; }
  // Writes frame `index` as its chunk: `stored` bytes of bslz4 (filter applied) or raw pixels
  // (the filter marked as skipped for this chunk, which every reader honours).
  void write_frame(std::uint64_t index, std::span<const std::byte> bytes, Stored stored);
  void flush();
  void close();

 private:
  std::string what_;
  long long file_ = -1, dset_ = -1;
  FrameShape shape_;
  std::uint64_t extent_ = 0;
  std::set<std::uint64_t> written_;
};

}  // namespace numastream::hdf5
