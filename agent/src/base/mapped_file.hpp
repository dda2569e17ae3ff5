// A regular file mapped for reading, so that what reads it (a codec) reads the page cache's pages
// without a copy into a buffer of its own. Internal to the agent.
//
// A mapped file cut short while it is mapped (truncated by another process, a network
// filesystem's server gone) would kill the process with SIGBUS at the first read past its new
// end. A handler installed with the first mapping replaces each such page with a page of zeros
// and marks the mapping cut short; whoever read from it asks cut_short() after reading and fails,
// naming the file, instead of sending zeros as the file's bytes. SIGBUS anywhere else goes to the
// handler before it (or the default: the process ends).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace numastream {

class MappedFile {
 public:
  // The first `size` bytes of `fd` (open for reading), or nullptr when they cannot be mapped
  // (the caller reads them instead): an empty file, a filesystem without mmap, every one of the
  // guard's slots in use.
  static std::shared_ptr<const MappedFile> map(int fd, std::size_t size, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // A read past the file's end (it was cut short since it was mapped) found zeros there.
  bool cut_short() const;

 private:
  MappedFile(const std::byte* data, std::size_t size, std::string path, int slot)
      : data_(data), size_(size), path_(std::move(path)), slot_(slot) {}
  const std::byte* data_;
  std::size_t size_;
  std::string path_;
  int slot_;
};

// A part of a mapped file that one reader holds (a chunk). When it is let go its pages leave the
// process's memory (they stay in the page cache): a file read through once never counts in full
// in the process's resident memory.
class MappedView {
 public:
  MappedView() = default;
  MappedView(std::shared_ptr<const MappedFile> file, std::size_t offset, std::size_t size);
  MappedView(MappedView&& o) noexcept
      : file_(std::move(o.file_)), bytes_(std::exchange(o.bytes_, {})) {}
  MappedView& operator=(MappedView&& o) noexcept;
  MappedView(const MappedView&) = delete;
  MappedView& operator=(const MappedView&) = delete;
  ~MappedView() { release(); }

  std::span<const std::byte> bytes() const { return bytes_; }
  const MappedFile* file() const { return file_.get(); }
  explicit operator bool() const { return file_ != nullptr; }

 private:
  void release() noexcept;
  std::shared_ptr<const MappedFile> file_;
  std::span<const std::byte> bytes_;
};

// What a reader says of a file that was cut short while it was read: `size` bytes when opened.
std::string cut_short_message(const std::string& path, std::size_t size);

}  // namespace numastream
