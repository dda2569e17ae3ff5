// Walking a Stream V2 message's whole tree (walk), and a start message for a series (start_for).
#include <cbor.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

#include "detector/stream2.hpp"
#include "detector/stream2_cbor.hpp"

namespace numastream::stream2 {
using namespace detail;

namespace {

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

namespace {

std::uint64_t big_endian64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<std::uint8_t>(p[i]);
  return v;
}

// The content of a typed array tag: its bytes, or tag 56500 around them.
bool typed_array(cbor_item_t* tag, Array& a, std::string& error) {
  const TypedTag* t = typed_tag(cbor_tag_value(tag));
  a.dtype = t->dtype;
  Item content(cbor_tag_item(tag));
  if (cbor_isa_tag(content.get()) && cbor_tag_value(content.get()) == kCompressed) {
    Item triple(cbor_tag_item(content.get()));
    if (!cbor_isa_array(triple.get()) || cbor_array_size(triple.get()) != 3) {
      error = "tag 56500 does not hold [algorithm, element size, bytes]";
      return false;
    }
    cbor_item_t** parts = cbor_array_handle(triple.get());
    auto algo = text(parts[0]);
    auto elem = unsigned_int(parts[1]);
    if (!algo || !elem || !cbor_isa_bytestring(parts[2]) ||
        !cbor_bytestring_is_definite(parts[2])) {
      error = "tag 56500 does not hold [algorithm, element size, bytes]";
      return false;
    }
    if (*algo == "bslz4") {
      a.compression = Compression::bslz4;
    } else if (*algo == "lz4") {
      a.compression = Compression::lz4;
    } else {
      error = "unknown compression \"" + std::string(algo->substr(0, 16)) + "\"";
      return false;
    }
    // bslz4 shuffles bits by element: its element size must be the array's. lz4 ignores it (an
    // EIGER2 states 0 for its lz4 frames).
    if (a.compression == Compression::bslz4 && *elem != t->size) {
      error =
          "tag 56500 states element size " + std::to_string(*elem) + " for a " + a.dtype + " array";
      return false;
    }
    a.elem_size = *elem;
    a.bytes = {reinterpret_cast<const std::byte*>(cbor_bytestring_handle(parts[2])),
               cbor_bytestring_length(parts[2])};
    return true;
  }
  if (!cbor_isa_bytestring(content.get()) || !cbor_bytestring_is_definite(content.get())) {
    error = "a typed array (tag " + std::to_string(t->tag) + ") that holds no byte string";
    return false;
  }
  a.bytes = {reinterpret_cast<const std::byte*>(cbor_bytestring_handle(content.get())),
             cbor_bytestring_length(content.get())};
  if (a.bytes.size() % t->size != 0) {
    error = "a " + a.dtype + " typed array of " + std::to_string(a.bytes.size()) + " bytes";
    return false;
  }
  return true;
}

// The elements an array holds: counted (uncompressed) or as its HDF5-filter framing states.
std::optional<std::uint64_t> element_bytes(const Array& a) {
  if (a.compression == Compression::none) return a.bytes.size();
  if (a.bytes.size() < 12) return std::nullopt;
  return big_endian64(a.bytes.data());
}

struct Walker {
  const std::function<void(const std::string&, const Value&)>& field;
  std::vector<std::string>& skipped;
  std::string& error;

  // The typed array `item` is, alone or inside tag 40 (with the tags' items kept alive while
  // `field` reads their bytes).
  bool array(const std::string& path, cbor_item_t* item) {
    Value v;
    v.kind = Value::Kind::array;
    if (cbor_tag_value(item) == kMultiDim) {
      Item pair(cbor_tag_item(item));
      if (!cbor_isa_array(pair.get()) || cbor_array_size(pair.get()) != 2 ||
          !cbor_isa_array(cbor_array_handle(pair.get())[0]) ||
          !cbor_isa_tag(cbor_array_handle(pair.get())[1]) ||
          !typed_tag(cbor_tag_value(cbor_array_handle(pair.get())[1]))) {
        error = path + ": tag 40 does not hold [dimensions, typed array]";
        return false;
      }
      cbor_item_t* dims = cbor_array_handle(pair.get())[0];
      std::uint64_t count = 1;
      for (std::size_t i = 0; i < cbor_array_size(dims); ++i) {
        auto d = unsigned_int(cbor_array_handle(dims)[i]);
        if (!d || *d == 0 || *d > (1ull << 32)) {
          error = path + ": a dimension that is not a positive integer";
          return false;
        }
        // Dimensions whose product wraps round would pass for a small array.
        if (count > (std::uint64_t{1} << 48) / *d) {
          error = path + ": dimensions of more than 2^48 elements";
          return false;
        }
        v.array.dims.push_back(*d);
        count *= *d;
      }
      if (!typed_array(cbor_array_handle(pair.get())[1], v.array, error)) {
        error = path + ": " + error;
        return false;
      }
      const auto bytes = element_bytes(v.array);
      if (v.array.dims.empty() || !bytes || *bytes != count * dtype_size_of(v.array.dtype)) {
        error = path + ": " + std::to_string(bytes.value_or(0)) + " bytes of " + v.array.dtype +
                " do not fill its dimensions";
        return false;
      }
      field(path, v);
      return true;
    }
    if (!typed_array(item, v.array, error)) {
      error = path + ": " + error;
      return false;
    }
    const auto bytes = element_bytes(v.array);
    v.array.dims = {bytes.value_or(0) / dtype_size_of(v.array.dtype)};
    field(path, v);
    return true;
  }

  static std::uint64_t dtype_size_of(const std::string& dtype) { return typed_tag(dtype)->size; }

  static std::optional<double> number(cbor_item_t* item) {
    if (cbor_isa_uint(item)) return static_cast<double>(cbor_get_int(item));
    if (cbor_isa_negint(item)) return -1.0 - static_cast<double>(cbor_get_int(item));
    if (cbor_isa_float_ctrl(item) && !cbor_float_ctrl_is_ctrl(item))
      return cbor_float_get_float(item);
    return std::nullopt;
  }

  bool value(const std::string& path, cbor_item_t* item, int depth) {
    Value v;
    if (cbor_isa_uint(item)) {
      v.kind = Value::Kind::unsigned_integer;
      v.u = cbor_get_int(item);
    } else if (cbor_isa_negint(item)) {
      if (cbor_get_int(item) > static_cast<std::uint64_t>(INT64_MAX)) {
        skipped.push_back(path);
        return true;
      }
      v.kind = Value::Kind::integer;
      v.i = -1 - static_cast<std::int64_t>(cbor_get_int(item));
    } else if (cbor_isa_float_ctrl(item)) {
      if (!cbor_float_ctrl_is_ctrl(item)) {
        v.kind = Value::Kind::real;
        v.d = cbor_float_get_float(item);
      } else if (cbor_is_bool(item)) {
        v.kind = Value::Kind::boolean;
        v.b = cbor_get_bool(item);
      } else {
        skipped.push_back(path);  // null, undefined
        return true;
      }
    } else if (auto t = text(item)) {
      v.kind = Value::Kind::text;
      v.s = *t;
    } else if (cbor_isa_tag(item)) {
      if (cbor_tag_value(item) == kMultiDim || typed_tag(cbor_tag_value(item)))
        return array(path, item);
      if (cbor_tag_value(item) == kDateTime) {  // arm_date, series_date: RFC 3339 text
        const Item inner(cbor_tag_item(item));
        if (auto date = text(inner.get())) {
          v.kind = Value::Kind::text;
          v.s = *date;  // the tag holds the text: valid while the message is
          field(path, v);
          return true;
        }
      }
      skipped.push_back(path);
      return true;
    } else if (cbor_isa_map(item)) {
      if (depth >= kMaxDepth || !cbor_map_is_definite(item)) {
        skipped.push_back(path);
        return true;
      }
      return map(path + "/", item, depth + 1);
    } else if (cbor_isa_array(item) && cbor_array_is_definite(item) && cbor_array_size(item) > 0) {
      cbor_item_t** items = cbor_array_handle(item);
      const std::size_t n = cbor_array_size(item);
      if (text(items[0])) {
        v.kind = Value::Kind::texts;
        for (std::size_t i = 0; i < n; ++i) {
          auto one = text(items[i]);
          if (!one) {
            skipped.push_back(path);
            return true;
          }
          v.texts.push_back(*one);
        }
      } else {
        v.kind = Value::Kind::reals;
        for (std::size_t i = 0; i < n; ++i) {
          auto d = number(items[i]);
          if (!d) {
            skipped.push_back(path);
            return true;
          }
          v.reals.push_back(*d);
        }
      }
    } else {
      skipped.push_back(path);
      return true;
    }
    field(path, v);
    return true;
  }

  bool map(const std::string& prefix, cbor_item_t* m, int depth) {
    const cbor_pair* pairs = cbor_map_handle(m);
    for (std::size_t i = 0; i < cbor_map_size(m); ++i) {
      auto key = text(pairs[i].key);
      if (!key || key->empty() || key->find('/') != std::string_view::npos) {
        skipped.push_back(prefix + "?");
        continue;
      }
      if (!value(prefix + std::string(*key), pairs[i].value, depth)) return false;
    }
    return true;
  }
};

}  // namespace

bool walk(std::span<const std::byte> message,
          const std::function<void(const std::string& path, const Value& value)>& field,
          std::vector<std::string>& skipped, std::string& error) {
  if (message.empty() || !sizes_plausible(message)) {
    error = message.empty() ? "empty message"
                            : "an array or map declares more items than the message has bytes";
    return false;
  }
  cbor_load_result result{};
  Item root(
      cbor_load(reinterpret_cast<const unsigned char*>(message.data()), message.size(), &result));
  if (!root || result.error.code != CBOR_ERR_NONE || result.read != message.size()) {
    error = "not one CBOR item";
    return false;
  }
  if (cbor_isa_tag(root.get()) && cbor_tag_value(root.get()) == kSelfDescribe)
    root = Item(cbor_tag_item(root.get()));
  if (!root || !cbor_isa_map(root.get()) || !cbor_map_is_definite(root.get())) {
    error = "not a CBOR map";
    return false;
  }
  Walker w{field, skipped, error};
  return w.map("", root.get(), 0);
}

std::vector<std::byte> start_for(std::span<const std::vector<std::byte>> series,
                                 const std::vector<StartInfo::Axis>& goniometer) {
  std::uint64_t id = 1, images = 0;
  std::string unique = "numastream-detector-sim";
  bool named = false;
  StartInfo info;  // what the first image says of the detector
  info.pixel_mask = false;
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
    if (parsed->type == Type::image && info.channels.empty()) {
      std::vector<std::string> skipped;
      walk(
          m,
          [&](const std::string& path, const Value& v) {
            if (path == "series_date" && v.kind == Value::Kind::text)
              info.arm_date = std::string(v.s);
            if (path.rfind("data/", 0) != 0 || v.kind != Value::Kind::array ||
                v.array.dims.size() != 2)
              return;
            info.channels.push_back(path.substr(5));
            info.dims = v.array.dims;
            info.dtype = v.array.dtype;
          },
          skipped, error);
    }
  }
  if (info.channels.empty()) return build_start(id, unique, images);
  info.series_id = id;
  info.series_unique_id = unique;
  info.number_of_images = images;
  info.beam_center_x = static_cast<double>(info.dims[1]) / 2;
  info.beam_center_y = static_cast<double>(info.dims[0]) / 2;
  info.goniometer = goniometer;
  return build_start(info);
}

}  // namespace numastream::stream2
