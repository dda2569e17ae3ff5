// libFuzzer target: a sender's state records as a restarted sender reads them from disk (what a
// crash, a full disk or another program may have left): the acknowledged record
// (stream-<id>.json: floor, sequences above it, declared gaps) and the taken-chunks record
// (stream-<id>.taken). Each is either read, with what it says well formed, or refused with a
// std::runtime_error naming the file; any other exception, a crash or an out-of-bounds access is a
// bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "store/state.hpp"

namespace {

const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/numastream-state-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    return std::string(tmpl);
  }();
  return dir;
}

void put(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numastream;
  const std::string& dir = scratch();
  put(dir + "/stream-7.json", data, size);
  try {
    StreamState s(dir, 7, 0.1);
    (void)s.load();
    for (const auto& g : s.gaps()) {
      if (g.end <= g.first || static_cast<std::uint64_t>(g.reason) < 1 ||
          static_cast<std::uint64_t>(g.reason) > wire::kLastGapReason)
        std::abort();  // a gap read back is a non-empty range of a known reason
    }
  } catch (const std::runtime_error&) {
    // refused, naming the file: what the sender does
  }
  put(dir + "/stream-7.taken", data, size);
  try {
    TakenRecord r(dir, 7);
    if (const auto e = r.earlier(); e && e->at_most < e->taken) std::abort();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
