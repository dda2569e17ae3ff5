#include "codec/synth.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "base/error.hpp"

namespace numastream {
namespace {

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// Inverse-CDF Poisson sampler over means quantised to 1/16 count: one 32-bit draw and a short
// walk from the mode per pixel, cheap enough to make frames at start-up.
class PoissonTable {
 public:
  explicit PoissonTable(double max_mean) {
    int steps = static_cast<int>(std::ceil(max_mean * kSteps)) + 1;
    cdfs_.resize(static_cast<std::size_t>(steps));
    for (int s = 0; s < steps; ++s) {
      double mean = static_cast<double>(s) / kSteps;
      auto& cdf = cdfs_[static_cast<std::size_t>(s)];
      double p = std::exp(-mean);
      double acc = 0;
      for (int k = 0;; ++k) {
        acc += p;
        cdf.push_back(static_cast<std::uint32_t>(std::min(acc, 1.0) * 4294967295.0));
        if (acc >= 1.0 - 1e-10 || k > 4 * static_cast<int>(mean) + 64) break;
        p *= mean / (k + 1);
      }
      cdf.back() = 0xFFFFFFFFu;
    }
  }

  std::uint16_t sample(double mean, std::uint32_t u) const noexcept {
    auto s = static_cast<std::size_t>(std::lround(std::max(mean, 0.0) * kSteps));
    const auto& cdf = cdfs_[std::min(s, cdfs_.size() - 1)];
    std::size_t k = std::min(static_cast<std::size_t>(mean), cdf.size() - 1);
    while (k > 0 && u <= cdf[k - 1]) --k;
    while (k + 1 < cdf.size() && u > cdf[k]) ++k;
    return static_cast<std::uint16_t>(k);
  }

 private:
  static constexpr int kSteps = 16;
  std::vector<std::vector<std::uint32_t>> cdfs_;
};

// Length of the chord through a disc of radius r centred at c, at position x.
double chord(double x, double c, double r) noexcept {
  double d = x - c;
  return d * d < r * r ? 2.0 * std::sqrt(r * r - d * d) : 0.0;
}

}  // namespace

void generate_projection(const SynthParams& p, int frame, std::span<std::byte> out) {
  NS_ASSERT(out.size() == p.chunk_bytes);
  NS_ASSERT(p.width > 0 && p.frames > 0);
  const std::size_t pixels = p.chunk_bytes / 2;
  const std::size_t width = p.width;
  const std::size_t height = (pixels + width - 1) / width;
  const double w = static_cast<double>(width);
  const double h = static_cast<double>(height);

  // Phantom: a water-like cylinder (axis vertical) holding two denser rods that orbit the axis as
  // the sample rotates; projection `frame` of `frames` covers 0..180 degrees.
  const double angle = std::numbers::pi * frame / p.frames;
  const double body_r = 0.35 * w;
  const double body_mu = p.attenuation / (2.0 * body_r);
  struct Rod {
    double orbit, phase, radius, mu, top, bottom;
  };
  const Rod rods[] = {{0.18 * w, 0.3, 0.05 * w, 2.0 * body_mu, 0.15 * h, 0.70 * h},
                      {0.10 * w, 2.4, 0.03 * w, 3.0 * body_mu, 0.40 * h, 0.95 * h}};

  PoissonTable table(p.flat_field * 1.05 + 1.0);
  SplitMix64 rng{p.seed * 0x2545F4914F6CDD1Dull + static_cast<std::uint64_t>(frame) + 1};
  std::vector<double> line(width);
  auto* px = reinterpret_cast<std::uint8_t*>(out.data());
  for (std::size_t y = 0; y < height; ++y) {
    // Beam profile: brighter in the middle rows, as a real flat field is.
    double dy = (static_cast<double>(y) - h / 2) / h;
    double flat = p.flat_field * (1.0 + 0.05 * std::exp(-8.0 * dy * dy)) / 1.05;
    for (std::size_t x = 0; x < width; ++x) {
      double xf = static_cast<double>(x) + 0.5;
      double mu_len = body_mu * chord(xf, w / 2, body_r);
      for (const Rod& r : rods) {
        if (static_cast<double>(y) < r.top || static_cast<double>(y) >= r.bottom) continue;
        double c = w / 2 + r.orbit * std::cos(angle + r.phase);
        mu_len += (r.mu - body_mu) * chord(xf, c, r.radius);
      }
      line[x] = flat * std::exp(-mu_len);
    }
    for (std::size_t x = 0; x < width; ++x) {
      std::size_t i = y * width + x;
      if (i >= pixels) break;
      std::uint16_t v = table.sample(line[x], static_cast<std::uint32_t>(rng.next() >> 32));
      px[2 * i] = static_cast<std::uint8_t>(v & 0xff);
      px[2 * i + 1] = static_cast<std::uint8_t>(v >> 8);
    }
  }
  if (p.chunk_bytes % 2) px[p.chunk_bytes - 1] = 0;
}

}  // namespace numastream
