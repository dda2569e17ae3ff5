// libFuzzer target: what the stream2 source does with each message from a detector before it
// sends it on. parse() must accept or refuse any bytes — not CBOR, truncated, nested without end,
// wrong types — without reading outside them, leaking or throwing; what it accepts names a series
// and, for an image, its number.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "detector/stream2.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numastream;
  std::string error;
  auto m = stream2::parse(std::as_bytes(std::span(data, size)), error);
  if (m) {
    if (!error.empty()) __builtin_trap();  // accepted with a complaint
    (void)stream2::type_name(m->type);
  } else if (error.empty()) {
    __builtin_trap();  // refused without saying why
  }
  return 0;
}
