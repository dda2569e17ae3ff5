// libFuzzer target: what the stream2 source does with each message from a detector before it
// sends it on. parse() must accept or refuse any bytes — not CBOR, truncated, nested without end,
// wrong types — without reading outside them, leaking or throwing; what it accepts names a series
// and, for an image, its number. walk() (what the gateway's HDF5 sink reads: every field, typed
// arrays, tag 40 and tag 56500) must do the same, and every array it hands out lies inside the
// message's decoded tree with a size its dimensions account for.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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
  std::vector<std::string> skipped;
  std::string walk_error;
  std::size_t touched = 0;
  const bool walked = stream2::walk(
      std::as_bytes(std::span(data, size)),
      [&](const std::string&, const stream2::Value& v) {
        if (v.kind != stream2::Value::Kind::array) return;
        for (std::byte b : v.array.bytes) touched += static_cast<std::size_t>(b);  // ASan checks the reads
        if (v.array.dims.empty()) __builtin_trap();
      },
      skipped, walk_error);
  if (!walked && walk_error.empty()) __builtin_trap();
  (void)touched;
  return 0;
}
