#include "detector/stream2.hpp"

#include <cbor.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <string_view>

namespace numastream::stream2 {
namespace {

struct ItemDeleter {
  void operator()(cbor_item_t* item) const noexcept { cbor_decref(&item); }
};
using Item = std::unique_ptr<cbor_item_t, ItemDeleter>;

constexpr std::uint64_t kSelfDescribe = 55799;

std::optional<std::string_view> text(cbor_item_t* item) {
  if (!cbor_isa_string(item) || !cbor_string_is_definite(item)) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(cbor_string_handle(item)), cbor_string_length(item));
}

std::optional<std::uint64_t> unsigned_int(cbor_item_t* item) {
  if (!cbor_isa_uint(item)) return std::nullopt;
  return cbor_get_int(item);
}

// libcbor allocates a definite array or map for the size its header declares before reading
// its items, so a few bytes that declare a billion items would ask for gigabytes. Each item takes
// at least one byte: a header declaring more items than bytes are left is refused here, walking
// the message with libcbor's streaming decoder, before cbor_load builds anything.
struct Walk {
  std::size_t left = 0;
  bool plausible = true;
};

bool sizes_plausible(std::span<const std::byte> bytes) {
  cbor_callbacks cb = cbor_empty_callbacks;
  cb.array_start = [](void* ctx, std::size_t n) {
    auto* w = static_cast<Walk*>(ctx);
    if (n > w->left) w->plausible = false;
  };
  cb.map_start = [](void* ctx, std::size_t n) {
    auto* w = static_cast<Walk*>(ctx);
    if (n > w->left / 2) w->plausible = false;
  };
  Walk w;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t pos = 0;
  while (pos < bytes.size() && w.plausible) {
    w.left = bytes.size() - pos;
    const cbor_decoder_result r = cbor_stream_decode(data + pos, bytes.size() - pos, &cb, &w);
    if (r.status != CBOR_DECODER_FINISHED || r.read == 0) break;  // cbor_load names the error
    pos += r.read;
  }
  return w.plausible;
}

}  // namespace

const char* type_name(Type t) noexcept {
  switch (t) {
    case Type::start: return "start";
    case Type::image: return "image";
    case Type::end: return "end";
  }
  return "?";
}

std::optional<Message> parse(std::span<const std::byte> bytes, std::string& error) {
  if (bytes.empty()) {
    error = "empty message";
    return std::nullopt;
  }
  if (!sizes_plausible(bytes)) {
    error = "an array or map declares more items than the message has bytes";
    return std::nullopt;
  }
  cbor_load_result result{};
  Item root(cbor_load(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), &result));
  if (!root || result.error.code != CBOR_ERR_NONE) {
    error = "not CBOR (error " + std::to_string(static_cast<int>(result.error.code)) + " at byte " +
            std::to_string(result.error.position) + ")";
    return std::nullopt;
  }
  if (result.read != bytes.size()) {
    error = std::to_string(bytes.size() - result.read) + " bytes after the CBOR item";
    return std::nullopt;
  }
  // Detectors mark each message as CBOR with the self-describe tag (55799) around the map.
  if (cbor_isa_tag(root.get()) && cbor_tag_value(root.get()) == kSelfDescribe) root = Item(cbor_tag_item(root.get()));
  if (!root || !cbor_isa_map(root.get()) || !cbor_map_is_definite(root.get())) {
    error = "not a CBOR map";
    return std::nullopt;
  }
  Message m;
  std::optional<std::string_view> type;
  std::optional<std::uint64_t> series_id, image_id;
  std::optional<std::string_view> unique;
  const cbor_pair* pairs = cbor_map_handle(root.get());
  for (std::size_t i = 0; i < cbor_map_size(root.get()); ++i) {
    auto key = text(pairs[i].key);
    if (!key) continue;
    if (*key == "type") {
      type = text(pairs[i].value);
      if (!type) error = "field type is not a text string";
    } else if (*key == "series_id") {
      series_id = unsigned_int(pairs[i].value);
      if (!series_id) error = "field series_id is not an unsigned integer";
    } else if (*key == "series_unique_id") {
      unique = text(pairs[i].value);
      if (!unique) error = "field series_unique_id is not a text string";
    } else if (*key == "image_id") {
      image_id = unsigned_int(pairs[i].value);
      if (!image_id) error = "field image_id is not an unsigned integer";
    }
    if (!error.empty()) return std::nullopt;
  }
  if (!type) {
    error = "no type field";
    return std::nullopt;
  }
  if (*type == "start") {
    m.type = Type::start;
  } else if (*type == "image") {
    m.type = Type::image;
  } else if (*type == "end") {
    m.type = Type::end;
  } else {
    error = "unknown type \"" + std::string(type->substr(0, 32)) + "\"";
    return std::nullopt;
  }
  if (!series_id) {
    error = std::string(type_name(m.type)) + " message without series_id";
    return std::nullopt;
  }
  m.series_id = *series_id;
  if (unique) m.series_unique_id = std::string(*unique);
  if (m.type == Type::image) {
    if (!image_id) {
      error = "image message without image_id";
      return std::nullopt;
    }
    m.image_id = *image_id;
  }
  return m;
}

std::vector<std::byte> build_start(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t number_of_images) {
  Item map(cbor_new_definite_map(4));
  auto add = [&](const char* key, cbor_item_t* value) {
    Item k(cbor_build_string(key)), v(value);
    if (!map || !k || !v || !cbor_map_add(map.get(), cbor_pair{k.get(), v.get()})) throw std::bad_alloc();
  };
  add("type", cbor_build_string("start"));
  add("series_id", cbor_build_uint64(series_id));
  add("series_unique_id", cbor_build_string(series_unique_id.c_str()));
  add("number_of_images", cbor_build_uint64(number_of_images));
  unsigned char* buf = nullptr;
  std::size_t cap = 0;
  Item tagged(cbor_new_tag(kSelfDescribe));  // as a detector marks its messages
  if (!tagged) throw std::bad_alloc();
  cbor_tag_set_item(tagged.get(), map.get());
  const std::size_t n = cbor_serialize_alloc(tagged.get(), &buf, &cap);
  if (n == 0) {
    std::free(buf);
    throw std::bad_alloc();
  }
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(buf), reinterpret_cast<std::byte*>(buf) + n);
  std::free(buf);
  return out;
}

std::vector<std::byte> start_for(std::span<const std::vector<std::byte>> series) {
  std::uint64_t id = 1, images = 0;
  std::string unique = "numastream-detector-sim";
  bool named = false;
  for (const auto& m : series) {
    std::string error;
    auto parsed = parse(m, error);
    if (!parsed) continue;
    images += parsed->type == Type::image;
    if (!named) {
      id = parsed->series_id;
      if (!parsed->series_unique_id.empty()) unique = parsed->series_unique_id;
      named = true;
    }
  }
  return build_start(id, unique, images);
}

}  // namespace numastream::stream2
