#include "codec/dtype.hpp"

#include <string_view>

namespace numastream {

std::size_t dtype_size(const std::string& dtype) noexcept {
  static constexpr std::pair<std::string_view, std::size_t> kSizes[] = {
      {"uint8", 1}, {"uint16", 2}, {"uint32", 4}, {"uint64", 8},  {"int8", 1},
      {"int16", 2}, {"int32", 4},  {"int64", 8},  {"float32", 4}, {"float64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (dtype == name) return size;
  }
  return 0;
}

}  // namespace numastream
