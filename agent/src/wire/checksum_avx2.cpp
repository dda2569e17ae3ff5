// XXH3-64 with AVX2, compiled for AVX2 (this file alone) and called only where the CPU has it
// (wire::checksum asks). XXH3's result is the same whatever vector unit computes it: the
// library's SSE2 build and this one agree on every input (tests/wire_test.cpp).
// On other CPUs than x86-64 it is never called (wire::checksum asks the CPU) and is built for
// the library's default vector unit.
#define XXH_INLINE_ALL
#if defined(__x86_64__)
#define XXH_VECTOR XXH_AVX2
#endif
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace numastream::wire::detail {

std::uint64_t xxh3_avx2(const void* data, std::size_t size) noexcept {
  return XXH3_64bits(data, size);
}

void* xxh3_state_avx2() noexcept { return XXH3_createState(); }
void xxh3_free_avx2(void* state) noexcept { XXH3_freeState(static_cast<XXH3_state_t*>(state)); }
void xxh3_reset_avx2(void* state) noexcept { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state)); }
void xxh3_update_avx2(void* state, const void* data, std::size_t size) noexcept {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
std::uint64_t xxh3_digest_avx2(const void* state) noexcept {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}

}  // namespace numastream::wire::detail
