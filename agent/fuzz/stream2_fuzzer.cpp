// libFuzzer target: what the stream2 source does with each message from a detector before it
// sends it on. parse() must accept or refuse any bytes — not CBOR, truncated, nested without end,
// wrong types — without reading outside them, leaking or throwing; what it accepts names a series
// and, for an image, its number. walk() (what the gateway's HDF5 sink reads: every field, typed
// arrays, tag 40 and tag 56500) must do the same, and every array it hands out lies inside the
// message's decoded tree with a size its dimensions account for. parse() reads the routing
// fields straight from the bytes and walk() decodes the whole message with libcbor: where walk
// reads a message whole, parse must read the same routing fields from it (a differential check;
// not where a routing field is given twice: parse refuses such a map, walk keeps one of them).
#include <cbor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "detector/stream2.hpp"

namespace {

// Whether the message's top-level map (under its self-describe tag) names a routing field more
// than once. CBOR calls such a map invalid (RFC 8949, 5.6); parse refuses it for one occurrence
// and walk keeps the other, so their readings are not compared.
bool routing_field_twice(const std::uint8_t* data, std::size_t size) {
  cbor_load_result r;
  cbor_item_t* root = cbor_load(data, size, &r);
  if (root == nullptr) return false;
  cbor_item_t* map = root;
  if (cbor_isa_tag(root)) map = cbor_tag_item(root);  // a new reference
  bool twice = false;
  if (cbor_isa_map(map) && cbor_map_is_definite(map)) {
    std::map<std::string, int> seen;
    const cbor_pair* pairs = cbor_map_handle(map);
    for (std::size_t i = 0; i < cbor_map_size(map); ++i) {
      cbor_item_t* k = pairs[i].key;
      if (!cbor_isa_string(k) || !cbor_string_is_definite(k)) continue;
      const std::string key(reinterpret_cast<const char*>(cbor_string_handle(k)),
                            cbor_string_length(k));
      if (key == "type" || key == "series_id" || key == "series_unique_id" || key == "image_id" ||
          key == "number_of_images")
        twice = twice || ++seen[key] > 1;
    }
  }
  if (map != root) cbor_decref(&map);
  cbor_decref(&root);
  return twice;
}

}  // namespace

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
  // The routing fields as walk reads them; `mistyped` when one had another type (parse refuses
  // the message then, walk does not).
  std::optional<std::string> type, unique, reason;
  std::optional<std::uint64_t> series, image, images;
  bool mistyped = false;
  auto text = [&](std::optional<std::string>& out, const stream2::Value& v) {
    if (v.kind == stream2::Value::Kind::text)
      out = std::string(v.s);
    else
      mistyped = true;
  };
  auto number = [&](std::optional<std::uint64_t>& out, const stream2::Value& v) {
    if (v.kind == stream2::Value::Kind::unsigned_integer)
      out = v.u;
    else
      mistyped = true;
  };
  const bool walked = stream2::walk(
      std::as_bytes(std::span(data, size)),
      [&](const std::string& path, const stream2::Value& v) {
        if (path == "type") text(type, v);
        if (path == "series_unique_id") text(unique, v);
        if (path == "series_id") number(series, v);
        if (path == "image_id") number(image, v);
        if (path == "number_of_images") number(images, v);
        if (path == "numastream/reason" && v.kind == stream2::Value::Kind::text)
          reason = std::string(v.s);
        for (const char* f :
             {"type/", "series_id/", "series_unique_id/", "image_id/", "number_of_images/"}) {
          if (path.starts_with(f)) mistyped = true;  // a routing field whose value is a map
        }
        if (v.kind != stream2::Value::Kind::array) return;
        for (std::byte b : v.array.bytes)
          touched += static_cast<std::size_t>(b);  // ASan checks the reads
        if (v.array.dims.empty()) __builtin_trap();
      },
      skipped, walk_error);
  if (!walked && walk_error.empty()) __builtin_trap();
  (void)touched;
  // A routing field walk could not hold as a value (a byte string, null, a tagged item), or a map
  // walk skipped inside (a key that is not text, an array it could not type), is one parse
  // refuses as mistyped.
  for (const auto& path : skipped) {
    for (const std::string f :
         {"type", "series_id", "series_unique_id", "image_id", "number_of_images"}) {
      if (path == f || path.starts_with(f + "/")) mistyped = true;
    }
  }
  const bool routable = type && (*type == "start" || *type == "image" || *type == "end") &&
                        series && (*type != "image" || image);
  if (walked && !mistyped && routable && !m && error.find("nested deeper") == std::string::npos &&
      !routing_field_twice(data, size)) {
    __builtin_trap();  // libcbor reads a whole Stream V2 message that parse refuses
  }
  if (walked && m) {
    if (!type || *type != stream2::type_name(m->type) || series != m->series_id ||
        unique.value_or("") != m->series_unique_id || images != m->number_of_images ||
        (m->type == stream2::Type::image && image != m->image_id) ||
        reason.value_or("").substr(0, 512) != m->incomplete) {
      __builtin_trap();  // parse and libcbor read different routing fields
    }
  }
  return 0;
}
