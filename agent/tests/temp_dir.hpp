// Temporary directories for the agent's tests, removed when the test program exits
// (NUMASTREAM_KEEP_TMP=1 keeps them to look at): a suite streams gigabytes through them, and a
// directory left behind by every run fills a machine that runs the suites again and again.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace numastream {

namespace detail {
struct TempDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  pid_t owner = ::getpid();  // a forked child that exits leaves them to the test program
  TempDirs() = default;
  TempDirs(const TempDirs&) = delete;
  TempDirs& operator=(const TempDirs&) = delete;
  ~TempDirs() {
    const char* keep = std::getenv("NUMASTREAM_KEEP_TMP");
    if ((keep && std::string(keep) == "1") || ::getpid() != owner) return;
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
inline TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}
}  // namespace detail

// A new directory under `parent` (/var/tmp for a disk filesystem, where O_DIRECT is taken).
inline std::string temp_dir(const std::string& parent = "/tmp") {
  std::string tmpl = parent + "/numastream-test-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp " + tmpl + " failed");
  detail::TempDirs& t = detail::temp_dirs();
  const std::lock_guard lock(t.mu);
  t.dirs.push_back(tmpl);
  return tmpl;
}

}  // namespace numastream
