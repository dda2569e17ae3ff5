// XXH3-64 with AVX2, compiled for AVX2 (this file alone) and called only where the CPU has it
// (wire::checksum asks). XXH3's result is the same whatever vector unit computes it: the
// library's SSE2 build and this one agree on every input (tests/wire_test.cpp).
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace numastream::wire::detail {

std::uint64_t xxh3_avx2(const void* data, std::size_t size) noexcept {
  return XXH3_64bits(data, size);
}

}  // namespace numastream::wire::detail
