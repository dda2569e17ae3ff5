#include "data/spill.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "base/error.hpp"
#include "base/files.hpp"

namespace numastream {
namespace {

constexpr std::size_t kLengthBytes =
    4;  // each record: its frame's length (little-endian), then the frame

bool write_all(int fd, const std::byte* p, std::size_t n, std::uint64_t off) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
    off += static_cast<std::uint64_t>(w);
  }
  return true;
}

void read_all(int fd, std::byte* p, std::size_t n, std::uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno("spill: reading " + path);
    if (r == 0)
      throw std::runtime_error("spill: " + path + " is shorter than what was written to it");
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::uint64_t>(r);
  }
}

}  // namespace

SpillStore::SpillStore(std::string dir, std::uint32_t stream, std::uint64_t max_bytes,
                       const Recover& recover)
    : dir_(std::move(dir)),
      stream_(stream),
      max_(max_bytes),
      segment_bytes_(std::clamp<std::uint64_t>(max_bytes / 8, 1 << 20, 256ULL << 20)) {
  // The agent's own (0700), whatever the umask: a gateway with file sinks sets the files' (0137
  // for 0640), under which a directory would have no search bit.
  try {
    make_parent_dirs(dir_ + "/", 0600);
  } catch (const std::system_error& e) {
    throw std::runtime_error("spill: cannot create " + dir_ + ": " + e.what());
  }
  std::error_code ec;
  // What an earlier process of this stream left: its segments by number.
  const std::string prefix = "spill-" + std::to_string(stream_) + "-";
  std::vector<std::pair<std::uint64_t, std::string>> earlier;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + 4 ||
        name.substr(name.size() - 4) != ".seg")
      continue;
    const std::string number = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    if (number.find_first_not_of("0123456789") != std::string::npos || number.size() > 18) continue;
    earlier.emplace_back(std::stoull(number), e.path().string());
  }
  if (ec) throw std::runtime_error("spill: cannot list " + dir_ + ": " + ec.message());
  std::sort(earlier.begin(), earlier.end());
  if (!recover) {
    // Not ours to send: those chunks were acknowledged, or are resent from the source.
    for (const auto& [n, path] : earlier) std::filesystem::remove(path, ec);
    return;
  }
  this->recover(earlier, recover);
}

// Keeps the earlier segments' records, oldest first, up to the first cut or refused one; the
// rest of that segment is cut off and every later segment removed.
void SpillStore::recover(const std::vector<std::pair<std::uint64_t, std::string>>& earlier,
                         const Recover& accept) {
  bool stopped = false;
  for (const auto& [number, path] : earlier) {
    next_id_ = std::max(next_id_, number + 1);
    if (stopped) {
      struct stat sb {};
      if (::stat(path.c_str(), &sb) == 0)
        recovered_.dropped_bytes += static_cast<std::uint64_t>(sb.st_size);
      ::unlink(path.c_str());
      continue;
    }
    Segment s;
    s.path = path;
    s.id = number;
    s.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (s.fd < 0) throw_errno("spill: opening " + path);
    struct stat sb {};
    if (::fstat(s.fd, &sb) != 0) throw_errno("spill: reading " + path);
    const auto file_size = static_cast<std::uint64_t>(sb.st_size);
    std::byte head[kLengthBytes + kRecoverHead];
    std::uint64_t frames = 0, bytes = 0;
    while (s.write_off < file_size) {
      const std::uint64_t left = file_size - s.write_off;
      std::uint32_t n = 0;
      if (left >= kLengthBytes) {
        read_all(s.fd, head, kLengthBytes, s.write_off, path);
        for (std::size_t i = 0; i < kLengthBytes; ++i)
          n |= static_cast<std::uint32_t>(head[i]) << (8 * i);
      }
      if (left < kLengthBytes || n == 0 || kLengthBytes + std::uint64_t{n} > left) {
        recovered_.why_dropped = path + ": a record cut short at byte " +
                                 std::to_string(s.write_off) +
                                 " (the earlier sender stopped while writing it)";
        stopped = true;
        break;
      }
      const std::size_t h = std::min<std::size_t>(n, kRecoverHead);
      read_all(s.fd, head + kLengthBytes, h, s.write_off + kLengthBytes, path);
      if (!accept({head + kLengthBytes, h}, n)) {
        recovered_.why_dropped = path + ": the record at byte " + std::to_string(s.write_off) +
                                 " is damaged or not a frame of stream " + std::to_string(stream_);
        stopped = true;
        break;
      }
      s.write_off += kLengthBytes + n;
      ++frames;
      bytes += n;
    }
    if (s.write_off < file_size) {
      recovered_.dropped_bytes += file_size - s.write_off;
      if (::ftruncate(s.fd, static_cast<off_t>(s.write_off)) != 0)
        throw_errno("spill: truncating " + path);
    }
    if (frames == 0) {
      ::close(s.fd);
      ::unlink(path.c_str());
      continue;
    }
    frames_ += frames;
    pending_ += bytes;
    disk_ += s.write_off;
    recovered_.frames += frames;
    recovered_.bytes += bytes;
    segments_.push_back(std::move(s));
  }
}

SpillStore::~SpillStore() {
  const bool held =
      std::any_of(segments_.begin(), segments_.end(), [](const Segment& s) { return s.held > 0; });
  if (frames_ == 0 && !held) {
    while (!segments_.empty()) drop_front();
    return;
  }
  // Frames not sent, or held by a reader that has not released them: kept for the next
  // process of the stream.
  for (auto& s : segments_) ::close(s.fd);
}

void SpillStore::open_segment() {
  Segment s;
  s.id = next_id_++;
  s.path = dir_ + "/spill-" + std::to_string(stream_) + "-" + std::to_string(s.id) + ".seg";
  s.fd = ::open(s.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (s.fd < 0) throw_errno("spill: creating " + s.path);
  segments_.push_back(std::move(s));
}

void SpillStore::drop_front() {
  Segment& s = segments_.front();
  ::close(s.fd);
  ::unlink(s.path.c_str());
  disk_ -= s.write_off;
  segments_.pop_front();
}

bool SpillStore::append(std::span<const std::byte> frame) { return append(frame, {}); }

bool SpillStore::append(std::span<const std::byte> head, std::span<const std::byte> rest,
                        std::span<const std::byte> tail) {
  const std::size_t size = head.size() + rest.size() + tail.size();
  const std::uint64_t record = kLengthBytes + size;
  disk_full_ = false;
  if (disk_ + record > max_) return false;
  if (segments_.empty() || segments_.back().write_off >= segment_bytes_) open_segment();
  Segment& s = segments_.back();
  std::byte len[kLengthBytes];
  const auto n = static_cast<std::uint32_t>(size);
  for (std::size_t i = 0; i < kLengthBytes; ++i) len[i] = static_cast<std::byte>(n >> (8 * i));
  if (!write_all(s.fd, len, kLengthBytes, s.write_off) ||
      !write_all(s.fd, head.data(), head.size(), s.write_off + kLengthBytes) ||
      !write_all(s.fd, rest.data(), rest.size(), s.write_off + kLengthBytes + head.size()) ||
      !write_all(s.fd, tail.data(), tail.size(),
                 s.write_off + kLengthBytes + head.size() + rest.size())) {
    if (errno == ENOSPC || errno == EDQUOT) {
      // Whatever part of the record made it is overwritten by the next append.
      disk_full_ = true;
      return false;
    }
    throw_errno("spill: writing " + s.path);
  }
  s.write_off += record;
  disk_ += record;
  pending_ += size;
  ++frames_;
  return true;
}

std::size_t SpillStore::reading() const {
  NS_ASSERT(frames_ > 0);
  std::size_t i = 0;
  while (i + 1 < segments_.size() && segments_[i].read_off == segments_[i].write_off) ++i;
  return i;
}

std::size_t SpillStore::next_size() const {
  if (frames_ == 0) return 0;
  const Segment& s = segments_[reading()];
  std::byte len[kLengthBytes];
  read_all(s.fd, len, kLengthBytes, s.read_off, s.path);
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) n |= static_cast<std::uint32_t>(len[i]) << (8 * i);
  return n;
}

std::size_t SpillStore::read(std::span<std::byte> out) { return read(out, nullptr); }

std::size_t SpillStore::read(std::span<std::byte> out, std::uint64_t* token) {
  NS_ASSERT(frames_ > 0);
  const std::size_t n = next_size();
  NS_ASSERT(out.size() >= n);
  Segment& s = segments_[reading()];
  read_all(s.fd, out.data(), n, s.read_off + kLengthBytes, s.path);
  s.read_off += kLengthBytes + n;
  pending_ -= n;
  --frames_;
  if (token) {
    ++s.held;
    *token = s.id;
  }
  trim();
  return n;
}

void SpillStore::release(std::uint64_t token) {
  for (Segment& s : segments_) {
    if (s.id == token) {
      NS_ASSERT(s.held > 0);
      --s.held;
      trim();
      return;
    }
  }
  NS_ASSERT(false);  // a token read() gave out, released once
}

void SpillStore::trim() {
  while (!segments_.empty()) {
    Segment& s = segments_.front();
    if (s.read_off < s.write_off || s.held > 0) return;
    if (segments_.size() > 1) {
      drop_front();
      continue;
    }
    // The only segment, read through: start it again from the beginning.
    if (::ftruncate(s.fd, 0) != 0) throw_errno("spill: truncating " + s.path);
    disk_ -= s.write_off;
    s.read_off = s.write_off = 0;
    return;
  }
}

}  // namespace numastream
