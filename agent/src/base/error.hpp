// Error helpers shared by every layer of the agent.
//
// Setup code throws (std::system_error for OS calls, ConfigError for bad configuration); the
// command line turns those into a clear message and a non-zero exit. Hot-path code is noexcept and
// reports failures through return values. NS_ASSERT stays on in release builds.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace numastream {

// The system's text for an errno value ("No such file or directory"), safe from any thread (unlike
// std::strerror, whose buffer threads may share).
std::string errno_text(int err);

// Throws std::system_error carrying errno and `what`.
[[noreturn]] void throw_errno(std::string_view what);

// A configuration or command-line problem. `field()` names the offending field
// (e.g. "placement.stages.compress.threads") so the user knows what to fix.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string field, const std::string& problem)
      : std::runtime_error("config field '" + field + "': " + problem), field_(std::move(field)) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line) noexcept;

}  // namespace numastream

#define NS_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::numastream::assert_fail(#cond, __FILE__, __LINE__))
