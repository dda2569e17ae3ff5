#include "detector/stream2.hpp"

#include <cbor.h>

#include <cstdlib>
#include <cstring>
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
constexpr std::uint64_t kMultiDim = 40;       // RFC 8746 row-major multi-dimensional array
constexpr std::uint64_t kCompressed = 56500;  // DECTRIS: [algorithm, element size, bytes]
constexpr std::uint64_t kDateTime = 0;        // RFC 8949 standard date/time string
constexpr int kMaxDepth = 8;
constexpr const char* kOurs = "numastream";  // the field numastream's own end messages add

// RFC 8746 typed array tags this reads: the little-endian ones (and the byte-sized ones).
struct TypedTag {
  std::uint64_t tag;
  const char* dtype;
  std::uint64_t size;
};
constexpr TypedTag kTypedTags[] = {{64, "uint8", 1},   {68, "uint8", 1},  {69, "uint16", 2},
                                   {70, "uint32", 4},  {71, "uint64", 8}, {72, "int8", 1},
                                   {77, "int16", 2},   {78, "int32", 4},  {79, "int64", 8},
                                   {85, "float32", 4}, {86, "float64", 8}};

const TypedTag* typed_tag(std::uint64_t tag) {
  for (const auto& t : kTypedTags) {
    if (t.tag == tag) return &t;
  }
  return nullptr;
}

const TypedTag* typed_tag(const std::string& dtype) {
  for (const auto& t : kTypedTags) {
    if (dtype == t.dtype && t.tag != 68) return &t;
  }
  return nullptr;
}

std::optional<std::string_view> text(cbor_item_t* item) {
  if (!cbor_isa_string(item) || !cbor_string_is_definite(item)) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(cbor_string_handle(item)),
                          cbor_string_length(item));
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
    case Type::start:
      return "start";
    case Type::image:
      return "image";
    case Type::end:
      return "end";
  }
  return "?";
}

namespace {

// The routing fields are read straight from the message's bytes: the map is walked item by item,
// every value that is not a routing field skipped by its length (a channel's pixels are a byte
// string, skipped in one step), nothing allocated and nothing copied but the series' unique id.
// cbor_load, which built the whole tree and copied the pixels, cost more than the rest of the
// sender's work per message.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b)
      : p_(reinterpret_cast<const unsigned char*>(b.data())), begin_(p_), end_(p_ + b.size()) {}

  std::size_t offset() const { return static_cast<std::size_t>(p_ - begin_); }
  std::size_t left() const { return static_cast<std::size_t>(end_ - p_); }
  const std::string& error() const { return error_; }

  // One item's head: its major type, its argument (a value or a length) and whether its length
  // is indefinite (arrays, maps, strings).
  struct Head {
    int major = 0;
    std::uint64_t arg = 0;
    bool indefinite = false;
  };
  bool head(Head& h) {
    if (p_ >= end_) return fail("truncated");
    const unsigned char ib = *p_++;
    h.major = ib >> 5;
    const int info = ib & 0x1f;
    h.indefinite = false;
    if (info < 24) {
      h.arg = static_cast<std::uint64_t>(info);
      return true;
    }
    if (info == 31) {
      if (h.major == 0 || h.major == 1 || h.major == 6) return fail("malformed");
      h.indefinite = true;  // major 7: the break stop code
      return true;
    }
    if (info > 27) return fail("malformed");
    const std::size_t n = std::size_t{1} << (info - 24);
    if (left() < n) return fail("truncated");
    h.arg = 0;
    for (std::size_t i = 0; i < n; ++i) h.arg = (h.arg << 8) | *p_++;
    return true;
  }

  // Skips one whole item (nested up to kMaxSkipDepth).
  bool skip(int depth = 0) {
    if (depth > kMaxSkipDepth) return fail("nested deeper than " + std::to_string(kMaxSkipDepth));
    Head h;
    if (!head(h)) return false;
    return skip_body(h, depth);
  }

  // A definite text string, viewed in place.
  bool text(const Head& h, std::string_view& out) {
    if (h.major != 3 || h.indefinite) return false;
    if (h.arg > left()) return fail("truncated");
    out = std::string_view(reinterpret_cast<const char*>(p_), h.arg);
    p_ += h.arg;
    return true;
  }

  bool skip_body(const Head& h, int depth) {
    switch (h.major) {
      case 0:
      case 1:
        return true;
      case 2:
      case 3:
        if (h.indefinite) return skip_chunks(h.major);
        if (h.arg > left()) return fail("truncated");
        p_ += h.arg;
        return true;
      case 4:
      case 5: {
        const std::uint64_t per = h.major == 5 ? 2 : 1;
        if (h.indefinite) {
          while (true) {
            if (p_ >= end_) return fail("truncated");
            if (*p_ == 0xff) {
              ++p_;
              return true;
            }
            for (std::uint64_t i = 0; i < per; ++i) {
              if (!skip(depth + 1)) return false;
            }
          }
        }
        if (h.arg > left() / per) return fail_sizes();
        for (std::uint64_t i = 0; i < h.arg * per; ++i) {
          if (!skip(depth + 1)) return false;
        }
        return true;
      }
      case 6:
        return skip(depth + 1);  // a tag: its item follows
      default:                   // simple values and floats: the head said it all
        if (h.indefinite) return fail("a break outside an indefinite item");
        return true;
    }
  }

  bool fail(const std::string& what) {
    if (error_.empty()) error_ = "not CBOR (" + what + " at byte " + std::to_string(offset()) + ")";
    return false;
  }
  bool fail_sizes() {
    if (error_.empty()) error_ = "an array or map declares more items than the message has bytes";
    return false;
  }

 private:
  static constexpr int kMaxSkipDepth = 64;
  // The chunks of an indefinite string: definite strings of the same major type, then a break.
  bool skip_chunks(int major) {
    while (true) {
      if (p_ >= end_) return fail("truncated");
      if (*p_ == 0xff) {
        ++p_;
        return true;
      }
      Head c;
      if (!head(c)) return false;
      if (c.major != major || c.indefinite) return fail("malformed string chunk");
      if (c.arg > left()) return fail("truncated");
      p_ += c.arg;
    }
  }

  const unsigned char* p_;
  const unsigned char* begin_;
  const unsigned char* end_;
  std::string error_;
};

}  // namespace

std::optional<Message> parse(std::span<const std::byte> bytes, std::string& error) {
  if (bytes.empty()) {
    error = "empty message";
    return std::nullopt;
  }
  Reader r(bytes);
  Reader::Head h;
  if (!r.head(h)) {
    error = r.error();
    return std::nullopt;
  }
  // Detectors mark each message as CBOR with the self-describe tag (55799) around the map.
  if (h.major == 6 && h.arg == kSelfDescribe && !r.head(h)) {
    error = r.error();
    return std::nullopt;
  }
  if (h.major != 5 || h.indefinite) {
    // Still a whole CBOR item? Then it is CBOR, but not the map a message is.
    if (r.skip_body(h, 0) && r.left() == 0) {
      error = "not a CBOR map";
    } else {
      error = r.error().empty() ? "not a CBOR map" : r.error();
    }
    return std::nullopt;
  }
  if (h.arg > r.left() / 2) {
    error = "an array or map declares more items than the message has bytes";
    return std::nullopt;
  }
  Message m;
  std::optional<std::string_view> type, unique;
  std::optional<std::uint64_t> series_id, image_id;
  // A routing field's value: a text string or an unsigned integer. A well-formed value of
  // another type sets `error` to `what`; false when the bytes are not CBOR (r.error()).
  auto read_text = [&](std::optional<std::string_view>& out, const char* what) {
    Reader::Head v;
    if (!r.head(v)) return false;
    std::string_view s;
    if (r.text(v, s)) {
      out = s;
      return true;
    }
    if (!r.error().empty() || !r.skip_body(v, 1)) return false;
    error = what;
    return true;
  };
  auto read_uint = [&](std::optional<std::uint64_t>& out, const char* what) {
    Reader::Head v;
    if (!r.head(v)) return false;
    if (v.major == 0) {
      out = v.arg;
      return true;
    }
    if (!r.skip_body(v, 1)) return false;
    error = what;
    return true;
  };
  // A key: a definite text string in `key`; any other key item is skipped (it names no field).
  auto read_key = [&](std::string_view& key, bool& is_text, int depth) {
    Reader::Head k;
    if (!r.head(k)) return false;
    is_text = r.text(k, key);
    return is_text || (r.error().empty() && r.skip_body(k, depth));
  };
  // numastream's own field: {"incomplete": true, "reason": ...} (build_end).
  auto read_ours = [&]() {
    Reader::Head v;
    if (!r.head(v)) return false;
    if (v.major != 5 || v.indefinite) return r.skip_body(v, 1);
    if (v.arg > r.left() / 2) return r.fail_sizes();
    for (std::uint64_t j = 0; j < v.arg; ++j) {
      std::string_view key;
      bool is_text = false;
      if (!read_key(key, is_text, 2)) return false;
      if (!is_text || key != "reason") {
        if (!r.skip(2)) return false;
        continue;
      }
      Reader::Head w;
      std::string_view why;
      if (!r.head(w)) return false;
      if (r.text(w, why)) {
        m.incomplete = std::string(why.substr(0, 512));
      } else if (!r.error().empty() || !r.skip_body(w, 2)) {
        return false;
      }
    }
    return true;
  };
  for (std::uint64_t i = 0; i < h.arg && error.empty(); ++i) {
    std::string_view key;
    bool is_text = false;
    if (!read_key(key, is_text, 1)) break;
    bool ok = true;
    if (!is_text) {  // NOLINT(bugprone-branch-clone): skipped as a key this reader does not know
      ok = r.skip(1);
    } else if (key == "type") {
      ok = read_text(type, "field type is not a text string");
    } else if (key == "series_id") {
      ok = read_uint(series_id, "field series_id is not an unsigned integer");
    } else if (key == "series_unique_id") {
      ok = read_text(unique, "field series_unique_id is not a text string");
    } else if (key == "image_id") {
      ok = read_uint(image_id, "field image_id is not an unsigned integer");
    } else if (key == "number_of_images") {
      std::optional<std::uint64_t> n;
      ok = read_uint(n, "field number_of_images is not an unsigned integer");
      m.number_of_images = n;
    } else if (key == kOurs) {
      ok = read_ours();
    } else {
      ok = r.skip(1);
    }
    if (!ok) break;
  }
  if (!r.error().empty()) {
    error = r.error();
    return std::nullopt;
  }
  if (!error.empty()) return std::nullopt;
  if (r.left() > 0) {
    error = std::to_string(r.left()) + " bytes after the CBOR item";
    return std::nullopt;
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

namespace {

Item owned(cbor_item_t* item) {
  if (!item) throw std::bad_alloc();
  return Item(item);
}

void put(cbor_item_t* map, const std::string& key, Item value) {
  Item k = owned(cbor_build_string(key.c_str()));
  if (!cbor_map_add(map, cbor_pair{k.get(), value.get()})) throw std::bad_alloc();
}

void push(cbor_item_t* array, Item value) {
  if (!cbor_array_push(array, value.get())) throw std::bad_alloc();
}

Item tagged(std::uint64_t tag, Item inner) {
  Item t = owned(cbor_new_tag(tag));
  cbor_tag_set_item(t.get(), inner.get());
  return t;
}

Item bytes_item(std::span<const std::byte> b) {
  return owned(cbor_build_bytestring(reinterpret_cast<cbor_data>(b.data()), b.size()));
}

Item dims_item(const std::vector<std::uint64_t>& dims) {
  Item a = owned(cbor_new_definite_array(dims.size()));
  for (auto d : dims) push(a.get(), owned(cbor_build_uint64(d)));
  return a;
}

// tag 40 [dims, typed array(content)]
Item multidim(const std::vector<std::uint64_t>& dims, const std::string& dtype, Item content) {
  const TypedTag* t = typed_tag(dtype);
  if (!t) throw std::invalid_argument("stream2: no typed array tag for dtype \"" + dtype + "\"");
  Item pair = owned(cbor_new_definite_array(2));
  push(pair.get(), dims_item(dims));
  push(pair.get(), tagged(t->tag, std::move(content)));
  return tagged(kMultiDim, std::move(pair));
}

// The map inside the self-describe tag, as a detector marks its messages.
std::vector<std::byte> serialize(Item map) {
  Item root = tagged(kSelfDescribe, std::move(map));
  unsigned char* buf = nullptr;
  std::size_t cap = 0;
  const std::size_t n = cbor_serialize_alloc(root.get(), &buf, &cap);
  if (n == 0) {
    std::free(buf);
    throw std::bad_alloc();
  }
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(buf),
                             reinterpret_cast<std::byte*>(buf) + n);
  std::free(buf);
  return out;
}

Item header(const char* type, std::uint64_t series_id, const std::string& unique,
            std::size_t fields) {
  Item map = owned(cbor_new_definite_map(fields + 3));
  put(map.get(), "type", owned(cbor_build_string(type)));
  put(map.get(), "series_id", owned(cbor_build_uint64(series_id)));
  put(map.get(), "series_unique_id", owned(cbor_build_string(unique.c_str())));
  return map;
}

}  // namespace

const char* compression_name(Compression c) noexcept {
  switch (c) {
    case Compression::none:
      return "none";
    case Compression::bslz4:
      return "bslz4";
    case Compression::lz4:
      return "lz4";
  }
  return "?";
}

std::vector<std::byte> build_start(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t number_of_images) {
  Item map = header("start", series_id, series_unique_id, 1);
  put(map.get(), "number_of_images", owned(cbor_build_uint64(number_of_images)));
  return serialize(std::move(map));
}

std::vector<std::byte> build_start(const StartInfo& info) {
  Item map = header("start", info.series_id, info.series_unique_id, 28);
  put(map.get(), "arm_date", tagged(kDateTime, owned(cbor_build_string(info.arm_date.c_str()))));
  put(map.get(), "detector_description",
      owned(cbor_build_string("numastream detector-sim (EIGER2-like)")));
  put(map.get(), "sensor_material", owned(cbor_build_string("Si")));
  put(map.get(), "sensor_thickness", owned(cbor_build_float8(450e-6)));
  put(map.get(), "pixel_size_x", owned(cbor_build_float8(75e-6)));
  put(map.get(), "pixel_size_y", owned(cbor_build_float8(75e-6)));
  Item translation = owned(cbor_new_definite_array(3));
  for (const double t : {0.0, 0.0, 0.12}) push(translation.get(), owned(cbor_build_float8(t)));
  put(map.get(), "detector_translation", std::move(translation));
  put(map.get(), "incident_energy",
      owned(cbor_build_float8(12398.4198 / info.incident_wavelength)));
  put(map.get(), "number_of_images", owned(cbor_build_uint64(info.number_of_images)));
  put(map.get(), "image_size_y", owned(cbor_build_uint64(info.dims.at(0))));
  put(map.get(), "image_size_x", owned(cbor_build_uint64(info.dims.at(1))));
  put(map.get(), "image_dtype", owned(cbor_build_string(info.dtype.c_str())));
  put(map.get(), "count_time", owned(cbor_build_float8(info.count_time)));
  put(map.get(), "frame_time", owned(cbor_build_float8(info.count_time)));
  put(map.get(), "beam_center_x", owned(cbor_build_float8(info.beam_center_x)));
  put(map.get(), "beam_center_y", owned(cbor_build_float8(info.beam_center_y)));
  put(map.get(), "incident_wavelength", owned(cbor_build_float8(info.incident_wavelength)));
  put(map.get(), "pixel_mask_enabled", owned(cbor_build_bool(true)));
  put(map.get(), "detector_serial_number", owned(cbor_build_string("numastream-sim-0")));
  put(map.get(), "countrate_correction_enabled", owned(cbor_build_bool(false)));
  put(map.get(), "flatfield_enabled", owned(cbor_build_bool(false)));
  put(map.get(), "virtual_pixel_interpolation_enabled", owned(cbor_build_bool(false)));
  put(map.get(), "user_data", owned(cbor_new_definite_map(0)));
  Item thresholds = owned(cbor_new_definite_map(info.channels.size()));
  for (std::size_t c = 0; c < info.channels.size(); ++c) {
    // 6 keV and up, a channel 2 keV above the one before (an EIGER2's two thresholds)
    put(thresholds.get(), info.channels[c],
        owned(cbor_build_float8(6000.0 + 2000.0 * static_cast<double>(c))));
  }
  put(map.get(), "threshold_energy", std::move(thresholds));
  const unsigned bits = info.dtype == "uint8" ? 8 : info.dtype == "uint16" ? 16 : 32;
  put(map.get(), "saturation_value", owned(cbor_build_uint64((std::uint64_t{1} << bits) - 2)));
  if (!info.goniometer.empty()) {
    Item axes = owned(cbor_new_definite_map(info.goniometer.size()));
    for (const auto& a : info.goniometer) {
      Item axis = owned(cbor_new_definite_map(2));
      put(axis.get(), "increment", owned(cbor_build_float8(a.increment)));
      put(axis.get(), "start", owned(cbor_build_float8(a.start)));
      put(axes.get(), a.name, std::move(axis));
    }
    put(map.get(), "goniometer", std::move(axes));
  }
  Item channels = owned(cbor_new_definite_array(info.channels.size()));
  Item masks = owned(cbor_new_definite_map(info.channels.size()));
  std::vector<std::byte> mask(info.pixel_mask ? info.dims.at(0) * info.dims.at(1) * 4 : 0);
  if (!mask.empty()) mask[0] = std::byte{1};  // pixel (0, 0): a gap, as masks mark them
  for (const auto& c : info.channels) {
    push(channels.get(), owned(cbor_build_string(c.c_str())));
    if (info.pixel_mask) put(masks.get(), c, multidim(info.dims, "uint32", bytes_item(mask)));
  }
  put(map.get(), "channels", std::move(channels));
  if (info.pixel_mask) put(map.get(), "pixel_mask", std::move(masks));
  return serialize(std::move(map));
}

std::vector<std::byte> build_image(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t image_id, const std::vector<std::uint64_t>& dims,
                                   const std::string& dtype, Compression compression,
                                   const std::vector<ChannelPixels>& channels,
                                   const ImageTimes* times) {
  const TypedTag* t = typed_tag(dtype);
  if (!t) throw std::invalid_argument("stream2: no typed array tag for dtype \"" + dtype + "\"");
  Item map = header("image", series_id, series_unique_id, times ? 6 : 2);
  put(map.get(), "image_id", owned(cbor_build_uint64(image_id)));
  if (times) {
    put(map.get(), "series_date",
        tagged(kDateTime, owned(cbor_build_string(times->series_date.c_str()))));
    const std::pair<const char*, std::uint64_t> fields[] = {
        {"start_time", times->start}, {"stop_time", times->stop}, {"real_time", times->real}};
    for (const auto& [name, ticks] : fields) {
      Item rational = owned(cbor_new_definite_array(2));
      push(rational.get(), owned(cbor_build_uint64(ticks)));
      push(rational.get(), owned(cbor_build_uint64(times->ticks_per_second)));
      put(map.get(), name, std::move(rational));
    }
  }
  Item data = owned(cbor_new_definite_map(channels.size()));
  for (const auto& c : channels) {
    Item content = bytes_item(c.bytes);
    if (compression != Compression::none) {
      Item triple = owned(cbor_new_definite_array(3));
      push(triple.get(), owned(cbor_build_string(compression_name(compression))));
      push(triple.get(), owned(cbor_build_uint64(t->size)));
      push(triple.get(), std::move(content));
      content = tagged(kCompressed, std::move(triple));
    }
    put(data.get(), c.name, multidim(dims, dtype, std::move(content)));
  }
  put(map.get(), "data", std::move(data));
  return serialize(std::move(map));
}

std::vector<std::byte> build_end(std::uint64_t series_id, const std::string& series_unique_id,
                                 const std::string& incomplete) {
  Item map = header("end", series_id, series_unique_id, incomplete.empty() ? 0 : 1);
  if (!incomplete.empty()) {
    Item ours = owned(cbor_new_definite_map(2));
    put(ours.get(), "incomplete", owned(cbor_build_bool(true)));
    put(ours.get(), "reason", owned(cbor_build_string(incomplete.c_str())));
    put(map.get(), kOurs, std::move(ours));
  }
  return serialize(std::move(map));
}

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
