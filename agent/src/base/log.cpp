#include "base/log.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace numastream {

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char stamp[40];
  const std::size_t n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(stamp + n, sizeof(stamp) - n, ".%03dZ", static_cast<int>(millis));
  return stamp;
}

void log_at(LogLevel level, const std::string& msg) {
  const std::string stamp = utc_now();
  const char* name = level == LogLevel::error ? "ERROR" : level == LogLevel::warn ? "WARN" : "INFO";
  char head[64];
  const int n = std::snprintf(head, sizeof(head), "%s %s numastream-agent: ", stamp.c_str(), name);
  std::string line(head, static_cast<std::size_t>(n > 0 ? n : 0));
  line += msg;
  line += '\n';
  // One write per line: lines of concurrent threads never interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace numastream
