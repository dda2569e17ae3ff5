#include "store/state.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "base/error.hpp"

namespace numastream {

namespace {

std::runtime_error io_error(const std::string& what, const std::string& path) {
  return std::runtime_error("state " + path + ": " + what + ": " + errno_text(errno));
}

}  // namespace

StreamState::StreamState(const std::string& dir, std::uint32_t stream, double wait_s)
    : path_(dir + "/stream-" + std::to_string(stream) + ".json"), stream_(stream) {
  const std::string lock = dir + "/stream-" + std::to_string(stream) + ".lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw io_error("cannot create the lock file", lock);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) {
      auto e = errno == EWOULDBLOCK
                   ? std::runtime_error("state " + lock + ": another sender of stream " +
                                        std::to_string(stream) + " still holds it after " +
                                        std::to_string(static_cast<int>(wait_s)) + " s")
                   : io_error("cannot lock", lock);
      ::close(lock_fd_);
      throw e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

StreamState::~StreamState() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

std::optional<std::pair<std::uint64_t, std::vector<std::uint64_t>>> StreamState::load() const {
  std::ifstream in(path_);
  if (!in) {
    if (errno == ENOENT) return std::nullopt;
    throw io_error("cannot read", path_);
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("stream") || !doc.contains("floor") ||
      !doc["floor"].is_number_unsigned() || (doc.contains("above") && !doc["above"].is_array())) {
    throw std::runtime_error("state " + path_ + ": not a numastream stream record");
  }
  if (doc["stream"] != stream_) {
    throw std::runtime_error("state " + path_ + ": records stream " + doc["stream"].dump() +
                             ", not " + std::to_string(stream_));
  }
  std::vector<std::uint64_t> above;
  for (const auto& v : doc.value("above", nlohmann::json::array())) {
    if (!v.is_number_unsigned())
      throw std::runtime_error("state " + path_ + ": an acknowledged sequence is not a number");
    above.push_back(v.get<std::uint64_t>());
  }
  return std::make_pair(doc["floor"].get<std::uint64_t>(), above);
}

std::vector<wire::Gap> StreamState::gaps() const {
  std::vector<wire::Gap> out;
  std::ifstream in(path_);
  if (!in) return out;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("gaps")) return out;
  const auto& gaps = doc["gaps"];
  if (!gaps.is_array()) throw std::runtime_error("state " + path_ + ": gaps is not a list");
  for (const auto& g : gaps) {
    if (!g.is_array() || g.size() != 3 || !g[0].is_number_unsigned() ||
        !g[1].is_number_unsigned() || !g[2].is_number_unsigned() ||
        g[1].get<std::uint64_t>() <= g[0].get<std::uint64_t>() || g[2].get<std::uint64_t>() < 1 ||
        g[2].get<std::uint64_t>() > wire::kLastGapReason) {
      throw std::runtime_error("state " + path_ + ": a gap is not [first, end, reason]");
    }
    out.push_back({g[0].get<std::uint64_t>(), g[1].get<std::uint64_t>(),
                   static_cast<wire::GapReason>(g[2].get<int>())});
  }
  return out;
}

void StreamState::save(std::uint64_t floor, const std::vector<std::uint64_t>& above,
                       const std::vector<wire::Gap>& gaps) {
  const std::string tmp = path_ + ".tmp";
  nlohmann::json jgaps = nlohmann::json::array();
  for (const auto& g : gaps) jgaps.push_back({g.first, g.end, static_cast<int>(g.reason)});
  const std::string text =
      nlohmann::json{{"stream", stream_}, {"floor", floor}, {"above", above}, {"gaps", jgaps}}
          .dump() +
      "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error("cannot write", tmp);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (!ok) throw io_error("cannot write", tmp);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) throw io_error("cannot replace", path_);
}

namespace {

// This boot of the node: a count written without fsync is exact only within it.
std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  id.resize(36, ' ');
  return id;
}

// Layout: "NSTK" | version u32 (1) | taken u64 | reserved u64 | boot id (36 bytes, text).
constexpr std::size_t kTakenSize = 4 + 4 + 8 + 8 + 36;

}  // namespace

TakenRecord::TakenRecord(const std::string& dir, std::uint32_t stream)
    : path_(dir + "/stream-" + std::to_string(stream) + ".taken"), boot_(boot_id()) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error("cannot open", path_);
  char buf[kTakenSize];
  const ssize_t n = ::pread(fd_, buf, sizeof(buf), 0);
  if (n < 0) {
    ::close(fd_);
    throw io_error("cannot read", path_);
  }
  if (n > 0) {
    std::uint32_t version = 0;
    std::memcpy(&version, buf + 4, 4);
    if (n != static_cast<ssize_t>(kTakenSize) || std::memcmp(buf, "NSTK", 4) != 0 || version != 1) {
      ::close(fd_);
      throw std::runtime_error("state " + path_ + ": not a numastream taken-chunks record");
    }
    Earlier e;
    std::memcpy(&e.taken, buf + 8, 8);
    std::memcpy(&e.at_most, buf + 16, 8);
    e.exact = std::string(buf + 24, 36) == boot_;
    if (e.exact) e.at_most = e.taken;
    e.at_most = std::max(e.at_most, e.taken);
    earlier_ = e;
    // This sender numbers on after everything the earlier ones may have taken.
    taken_ = reserved_ = e.at_most;
  }
}

TakenRecord::~TakenRecord() {
  if (fd_ >= 0) ::close(fd_);
}

void TakenRecord::write(bool sync) {
  char buf[kTakenSize];
  const std::uint32_t version = 1;
  constexpr char kMagic[4] = {'N', 'S', 'T', 'K'};  // the record's magic, no terminator
  std::memcpy(buf, kMagic, sizeof kMagic);
  std::memcpy(buf + 4, &version, 4);
  std::memcpy(buf + 8, &taken_, 8);
  std::memcpy(buf + 16, &reserved_, 8);
  std::memcpy(buf + 24, boot_.data(), 36);
  if (::pwrite(fd_, buf, sizeof(buf), 0) != static_cast<ssize_t>(sizeof(buf)))
    throw io_error("cannot write", path_);
  if (sync && ::fdatasync(fd_) != 0) throw io_error("cannot sync", path_);
}

void TakenRecord::taken(std::uint64_t n) {
  taken_ = n;
  const bool reserve = taken_ > reserved_;
  if (reserve) reserved_ = taken_ + kReserve;
  write(reserve);
}

}  // namespace numastream
