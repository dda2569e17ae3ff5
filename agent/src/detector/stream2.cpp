// Reading a Stream V2 message's routing fields (parse).
#include "detector/stream2.hpp"

#include <cbor.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

#include "detector/stream2_cbor.hpp"

namespace numastream::stream2 {
using namespace detail;

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

}  // namespace numastream::stream2
