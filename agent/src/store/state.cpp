#include "store/state.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

namespace numastream {

namespace {

std::runtime_error io_error(const std::string& what, const std::string& path) {
  return std::runtime_error("state " + path + ": " + what + ": " + std::strerror(errno));
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
      auto e = errno == EWOULDBLOCK ? std::runtime_error("state " + lock + ": another sender of stream " +
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
    throw std::runtime_error("state " + path_ + ": records stream " + doc["stream"].dump() + ", not " +
                             std::to_string(stream_));
  }
  std::vector<std::uint64_t> above;
  for (const auto& v : doc.value("above", nlohmann::json::array())) above.push_back(v.get<std::uint64_t>());
  return std::make_pair(doc["floor"].get<std::uint64_t>(), above);
}

void StreamState::save(std::uint64_t floor, const std::vector<std::uint64_t>& above) {
  const std::string tmp = path_ + ".tmp";
  const std::string text = nlohmann::json{{"stream", stream_}, {"floor", floor}, {"above", above}}.dump() + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error("cannot write", tmp);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (!ok) throw io_error("cannot write", tmp);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) throw io_error("cannot replace", path_);
}

}  // namespace numastream
