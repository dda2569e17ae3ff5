#include "base/error.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>

namespace numastream {

std::string errno_text(int err) { return std::generic_category().message(err); }

void throw_errno(std::string_view what) {
  throw std::system_error(errno, std::generic_category(), std::string(what));
}

void assert_fail(const char* expr, const char* file, int line) noexcept {
  std::fprintf(stderr, "numastream-agent: internal error: assertion '%s' failed at %s:%d\n", expr,
               file, line);
  std::abort();
}

}  // namespace numastream
