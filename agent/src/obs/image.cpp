#include "obs/image.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace numastream::image {
namespace {

// A pixel as a number, or NaN when it is masked.
using Reader = double (*)(const std::byte*);

template <typename T>
double read_unsigned(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v == std::numeric_limits<T>::max() ? std::numeric_limits<double>::quiet_NaN()
                                            : static_cast<double>(v);
}

template <typename T>
double read_value(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

struct Kind {
  Reader read;
  std::size_t size;
};

Kind kind_of(const std::string& dtype) {
  if (dtype == "uint8") return {read_unsigned<std::uint8_t>, 1};
  if (dtype == "uint16") return {read_unsigned<std::uint16_t>, 2};
  if (dtype == "uint32") return {read_unsigned<std::uint32_t>, 4};
  if (dtype == "uint64") return {read_unsigned<std::uint64_t>, 8};
  if (dtype == "int8") return {read_value<std::int8_t>, 1};
  if (dtype == "int16") return {read_value<std::int16_t>, 2};
  if (dtype == "int32") return {read_value<std::int32_t>, 4};
  if (dtype == "int64") return {read_value<std::int64_t>, 8};
  if (dtype == "float32") return {read_value<float>, 4};
  if (dtype == "float64") return {read_value<double>, 8};
  throw std::invalid_argument("pixels of type '" + dtype + "' cannot be shown");
}

void chunk(std::string& out, const char type[4], const std::string& data) {
  const std::uint32_t n = static_cast<std::uint32_t>(data.size());
  const char len[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 8), static_cast<char>(n)};
  out.append(len, 4);
  const std::size_t start = out.size();
  out.append(type, 4);
  out += data;
  uLong crc = crc32(0, reinterpret_cast<const Bytef*>(out.data() + start),
                    static_cast<uInt>(out.size() - start));
  const char c[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                     static_cast<char>(crc >> 8), static_cast<char>(crc)};
  out.append(c, 4);
}

void be32(std::string& s, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((v >> shift) & 0xff);
}

}  // namespace

void colour(double t, std::uint8_t out[3]) noexcept {
  static constexpr double stops[][3] = {
      {0, 0, 4}, {87, 16, 110}, {188, 55, 84}, {249, 142, 9}, {252, 255, 164}};
  if (!(t > 0)) t = 0;  // NaN too
  if (t > 1) t = 1;
  const double x = t * 4;
  const int i = std::min(3, static_cast<int>(x));
  const double f = x - i;
  for (int c = 0; c < 3; ++c)
    out[c] =
        static_cast<std::uint8_t>(std::lround(stops[i][c] + f * (stops[i + 1][c] - stops[i][c])));
}

Rgb render(std::span<const std::byte> pixels, const std::string& dtype, std::size_t rows,
           std::size_t cols, std::size_t max_side) {
  const Kind k = kind_of(dtype);
  if (rows == 0 || cols == 0)
    throw std::invalid_argument("a frame of " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " pixels");
  if (rows > pixels.size() / cols / k.size || rows * cols * k.size != pixels.size()) {
    throw std::invalid_argument(std::to_string(pixels.size()) + " bytes are not " +
                                std::to_string(rows) + " x " + std::to_string(cols) +
                                " pixels of " + dtype);
  }
  max_side = std::max<std::size_t>(1, max_side);
  const std::size_t b =
      std::max((rows + max_side - 1) / max_side, (cols + max_side - 1) / max_side);
  Rgb img;
  img.height = (rows + b - 1) / b;
  img.width = (cols + b - 1) / b;
  std::vector<double> sum(img.width * img.height, 0), mean(img.width * img.height);
  std::vector<std::uint32_t> count(img.width * img.height, 0);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::byte* row = pixels.data() + r * cols * k.size;
    const std::size_t out_row = (r / b) * img.width;
    for (std::size_t c = 0; c < cols; ++c) {
      const double v = k.read(row + c * k.size);
      if (std::isnan(v)) continue;
      sum[out_row + c / b] += v;
      ++count[out_row + c / b];
    }
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (std::size_t i = 0; i < mean.size(); ++i) {
    mean[i] = count[i] ? sum[i] / count[i] : std::numeric_limits<double>::quiet_NaN();
    if (count[i] && std::isfinite(mean[i])) lo = std::min(lo, mean[i]), hi = std::max(hi, mean[i]);
  }
  const double span = hi > lo ? std::log1p(hi - lo) : 0;
  img.pixels.resize(mean.size() * 3);
  for (std::size_t i = 0; i < mean.size(); ++i) {
    std::uint8_t* px = &img.pixels[i * 3];
    if (!std::isfinite(mean[i])) {
      std::memcpy(px, kMasked, 3);
    } else {
      colour(span > 0 ? std::log1p(mean[i] - lo) / span : 0, px);
    }
  }
  return img;
}

std::string png(const Rgb& image) {
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  be32(ihdr, static_cast<std::uint32_t>(image.width));
  be32(ihdr, static_cast<std::uint32_t>(image.height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, no filter, no interlace
  chunk(out, "IHDR", ihdr);
  std::string raw;
  raw.reserve(image.height * (image.width * 3 + 1));
  for (std::size_t r = 0; r < image.height; ++r) {
    raw += '\0';  // filter: none
    raw.append(reinterpret_cast<const char*>(image.pixels.data() + r * image.width * 3),
               image.width * 3);
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string z(size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &size,
                reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                6) != Z_OK) {
    throw std::runtime_error("png: zlib could not compress the image");
  }
  z.resize(size);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", "");
  return out;
}

}  // namespace numastream::image
