// A detector frame as a picture for the people at the experiment: binned down to fit a screen,
// on a logarithmic colour scale (a detector's counts span decades), masked pixels in a colour of
// their own. Pure functions; the PNG is written with zlib.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace numastream::image {

struct Rgb {
  std::size_t width = 0, height = 0;
  std::vector<std::uint8_t> pixels;  // rows top to bottom, 3 bytes a pixel
};

// The colour of masked pixels: a green no value of the scale has.
inline constexpr std::uint8_t kMasked[3] = {0, 255, 0};

// The colour of `t` in [0, 1] on the scale (dark purple through red and orange to pale yellow).
void colour(double t, std::uint8_t out[3]) noexcept;

// Renders `rows` x `cols` pixels of `dtype` (codec/dtype.hpp names; little-endian) into at most
// `max_side` x `max_side`: blocks of b x b pixels (b the smallest that fits) become one, the mean
// of their pixels that are not masked; a block with none is masked. Masked: an unsigned pixel with
// every bit set (how EIGER detectors mark gaps and bad pixels), a NaN. The colour scale runs from
// the lowest to the highest binned value, logarithmically. Throws std::invalid_argument naming
// the problem when the bytes do not hold rows x cols pixels of a known dtype.
Rgb render(std::span<const std::byte> pixels, const std::string& dtype, std::size_t rows,
           std::size_t cols, std::size_t max_side);

// The image as a PNG file (8-bit RGB).
std::string png(const Rgb& image);

}  // namespace numastream::image
