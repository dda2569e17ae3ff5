#include "store/undo_journal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace numastream::hdf5 {
namespace {

constexpr char kMagic[8] = {'N', 'S', 'U', 'N', 'D', 'O', '1', '\n'};
constexpr std::size_t kHeader = 16;  // magic, committed length
constexpr std::size_t kRecord = 24;  // offset, length, check

void put64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

std::uint64_t get64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

// FNV-1a over a record's offset, length and bytes: tells a whole record from a torn one.
std::uint64_t check_of(std::uint64_t offset, std::span<const std::byte> bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::byte b) {
    h ^= std::to_integer<std::uint64_t>(b);
    h *= 0x100000001b3ULL;
  };
  std::byte head[16];
  put64(head, offset);
  put64(head + 8, bytes.size());
  for (std::byte b : head) mix(b);
  for (std::byte b : bytes) mix(b);
  return h;
}

int pwrite_all(int fd, const std::byte* p, std::size_t n, std::uint64_t at) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
    at += static_cast<std::uint64_t>(w);
  }
  return 0;
}

std::vector<std::byte> read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("undo journal: open " + path);
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  while (true) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      errno = err;
      throw_errno("undo journal: read " + path);
    }
    if (r == 0) break;
    out.insert(out.end(), buf, buf + r);
  }
  ::close(fd);
  return out;
}

}  // namespace

UndoJournal::UndoJournal(std::string file, std::uint64_t committed) noexcept
    : path_(std::move(file) + ".undo"), committed_(committed) {}

UndoJournal::~UndoJournal() {
  if (fd_ >= 0) ::close(fd_);
}

int UndoJournal::save(std::uint64_t offset, std::span<const std::byte> old) {
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) return errno;
    end_ = 0;
  }
  std::vector<std::byte> rec((end_ == 0 ? kHeader : 0) + kRecord + old.size());
  std::byte* p = rec.data();
  if (end_ == 0) {
    std::memcpy(p, kMagic, 8);
    put64(p + 8, committed_);
    p += kHeader;
  }
  put64(p, offset);
  put64(p + 8, old.size());
  put64(p + 16, check_of(offset, old));
  if (!old.empty()) std::memcpy(p + kRecord, old.data(), old.size());
  if (const int err = pwrite_all(fd_, rec.data(), rec.size(), end_)) return err;
  end_ += rec.size();
  return 0;
}

int UndoJournal::commit(std::uint64_t length) {
  committed_ = length;
  if (end_ == 0) return 0;
  if (::ftruncate(fd_, 0) != 0) return errno;
  end_ = 0;
  return 0;
}

int UndoJournal::remove() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  end_ = 0;
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) return errno;
  return 0;
}

std::string UndoJournal::roll_back(const std::string& file) {
  const std::string path = file + ".undo";
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) {
    if (errno == ENOENT) return "";
    throw_errno("undo journal: stat " + path);
  }
  const std::vector<std::byte> j = read_whole(path);
  // A header cut short: the first save was killed before its write, nothing was overwritten.
  if (j.size() < kHeader || std::memcmp(j.data(), kMagic, 8) != 0) {
    if (::unlink(path.c_str()) != 0) throw_errno("undo journal: remove " + path);
    return "";
  }
  const std::uint64_t committed = get64(j.data() + 8);
  struct Saved {
    std::uint64_t offset;
    std::span<const std::byte> bytes;
  };
  std::vector<Saved> saved;
  for (std::size_t at = kHeader; j.size() - at >= kRecord;) {
    const std::uint64_t offset = get64(j.data() + at), n = get64(j.data() + at + 8);
    if (n > j.size() - at - kRecord) break;  // cut short
    std::span<const std::byte> bytes(j.data() + at + kRecord, n);
    if (get64(j.data() + at + 16) != check_of(offset, bytes)) break;  // torn
    saved.push_back({offset, bytes});
    at += kRecord + n;
  }
  const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("undo journal: open " + file + " to roll it back");
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    if (const int err = pwrite_all(fd, it->bytes.data(), it->bytes.size(), it->offset)) {
      ::close(fd);
      errno = err;
      throw_errno("undo journal: write " + file + " back");
    }
  }
  struct stat fs {};
  const bool longer = ::fstat(fd, &fs) == 0 && static_cast<std::uint64_t>(fs.st_size) > committed;
  if (longer && ::ftruncate(fd, static_cast<off_t>(committed)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    throw_errno("undo journal: cut " + file + " back");
  }
  ::close(fd);
  if (::unlink(path.c_str()) != 0) throw_errno("undo journal: remove " + path);
  if (saved.empty() && !longer) return "";
  return file + ": a flush a kill interrupted was undone (" + std::to_string(saved.size()) +
         " range(s) written back, the file cut to " + std::to_string(committed) +
         " bytes): it is as its last complete flush left it";
}

}  // namespace numastream::hdf5
