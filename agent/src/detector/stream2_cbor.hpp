// What the Stream V2 reader, builders and walker share (stream2.cpp, stream2_build.cpp,
// stream2_walk.cpp): libcbor items that free themselves, the tags DECTRIS's messages use, and the
// RFC 8746 typed arrays. Internal to them.
#pragma once
#include <cbor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace numastream::stream2::detail {

struct ItemDeleter {
  void operator()(cbor_item_t* item) const noexcept { cbor_decref(&item); }
};
using Item = std::unique_ptr<cbor_item_t, ItemDeleter>;

inline constexpr std::uint64_t kSelfDescribe = 55799;
inline constexpr std::uint64_t kMultiDim = 40;       // RFC 8746 row-major multi-dimensional array
inline constexpr std::uint64_t kCompressed = 56500;  // DECTRIS: [algorithm, element size, bytes]
inline constexpr std::uint64_t kDateTime = 0;        // RFC 8949 standard date/time string
inline constexpr int kMaxDepth = 8;
inline constexpr const char* kOurs = "numastream";  // the field numastream's own end messages add

// RFC 8746 typed array tags this reads: the little-endian ones (and the byte-sized ones).
struct TypedTag {
  std::uint64_t tag;
  const char* dtype;
  std::uint64_t size;
};
inline constexpr TypedTag kTypedTags[] = {{64, "uint8", 1},   {68, "uint8", 1},  {69, "uint16", 2},
                                          {70, "uint32", 4},  {71, "uint64", 8}, {72, "int8", 1},
                                          {77, "int16", 2},   {78, "int32", 4},  {79, "int64", 8},
                                          {85, "float32", 4}, {86, "float64", 8}};

inline const TypedTag* typed_tag(std::uint64_t tag) {
  for (const auto& t : kTypedTags) {
    if (t.tag == tag) return &t;
  }
  return nullptr;
}

inline const TypedTag* typed_tag(const std::string& dtype) {
  for (const auto& t : kTypedTags) {
    if (dtype == t.dtype && t.tag != 68) return &t;
  }
  return nullptr;
}

inline std::optional<std::string_view> text(cbor_item_t* item) {
  if (!cbor_isa_string(item) || !cbor_string_is_definite(item)) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(cbor_string_handle(item)),
                          cbor_string_length(item));
}

inline std::optional<std::uint64_t> unsigned_int(cbor_item_t* item) {
  if (!cbor_isa_uint(item)) return std::nullopt;
  return cbor_get_int(item);
}

}  // namespace numastream::stream2::detail
