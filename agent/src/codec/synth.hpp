// Synthetic tomography projections that look like the paper's data: 16-bit photon counts of an
// X-ray beam attenuated by a rotating phantom, with Poisson noise. Plain LZ4 gets near 2:1 on them
// the way it does on real detector frames (low counts repeat), not through runs of zeros.
// Deterministic from the seed: a receiver can regenerate and compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace numastream {

struct SynthParams {
  std::uint64_t seed = 1;
  std::size_t chunk_bytes = 2560 * 2160 * 2;  // one 2560x2160 16-bit projection
  std::size_t width = 2560;                   // pixels per row
  int frames = 4;                             // distinct projections, cycled
  double flat_field = 10.0;                   // mean photon counts of the open beam
  double attenuation = 1.5;                   // mu * length through the thickest part
};

// Fills `out` (params.chunk_bytes long) with projection number `frame`.
void generate_projection(const SynthParams& params, int frame, std::span<std::byte> out);

}  // namespace numastream
