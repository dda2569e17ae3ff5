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

namespace {

// One message's routing fields, read off a Reader positioned at the top-level map's items.
class RoutingFields {
 public:
  RoutingFields(Reader& r, std::string& error) : r_(r), error_(error) {}

  // The map's `items` key-value pairs; false when the bytes are not CBOR (r.error()) or a field
  // has the wrong type (error).
  bool read(std::uint64_t items) {
    for (std::uint64_t i = 0; i < items && error_.empty(); ++i) {
      std::string_view key;
      bool is_text = false;
      if (!read_key(key, is_text, 1) || !field(is_text, key)) break;
    }
    return r_.error().empty() && error_.empty();
  }

  // The message the fields make, or nullopt with `error` saying what is missing.
  std::optional<Message> message() {
    if (!type_) return fail("no type field");
    if (*type_ == "start") {
      m_.type = Type::start;
    } else if (*type_ == "image") {
      m_.type = Type::image;
    } else if (*type_ == "end") {
      m_.type = Type::end;
    } else {
      return fail("unknown type \"" + std::string(type_->substr(0, 32)) + "\"");
    }
    if (!series_id_) return fail(std::string(type_name(m_.type)) + " message without series_id");
    m_.series_id = *series_id_;
    if (unique_) m_.series_unique_id = std::string(*unique_);
    if (m_.type == Type::image) {
      if (!image_id_) return fail("image message without image_id");
      m_.image_id = *image_id_;
    }
    return m_;
  }

 private:
  std::optional<Message> fail(std::string why) {
    error_ = std::move(why);
    return std::nullopt;
  }

  bool field(bool is_text, std::string_view key) {
    if (!is_text) return r_.skip(1);  // a key this reader does not know
    if (key == "type") return read_text(type_, "field type is not a text string");
    if (key == "series_id")
      return read_uint(series_id_, "field series_id is not an unsigned integer");
    if (key == "series_unique_id")
      return read_text(unique_, "field series_unique_id is not a text string");
    if (key == "image_id") return read_uint(image_id_, "field image_id is not an unsigned integer");
    if (key == "number_of_images")
      return read_uint(m_.number_of_images, "field number_of_images is not an unsigned integer");
    if (key == kOurs) return read_ours();
    return r_.skip(1);
  }

  // A routing field's value: a text string or an unsigned integer. A well-formed value of
  // another type sets `error` to `what`; false when the bytes are not CBOR (r.error()).
  bool read_text(std::optional<std::string_view>& out, const char* what) {
    Reader::Head v;
    if (!r_.head(v)) return false;
    std::string_view s;
    if (r_.text(v, s)) {
      out = s;
      return true;
    }
    if (!r_.error().empty() || !r_.skip_body(v, 1)) return false;
    error_ = what;
    return true;
  }

  bool read_uint(std::optional<std::uint64_t>& out, const char* what) {
    Reader::Head v;
    if (!r_.head(v)) return false;
    if (v.major == 0) {
      out = v.arg;
      return true;
    }
    if (!r_.skip_body(v, 1)) return false;
    error_ = what;
    return true;
  }

  // A key: a definite text string in `key`; any other key item is skipped (it names no field).
  bool read_key(std::string_view& key, bool& is_text, int depth) {
    Reader::Head k;
    if (!r_.head(k)) return false;
    is_text = r_.text(k, key);
    return is_text || (r_.error().empty() && r_.skip_body(k, depth));
  }

  // numastream's own field: {"incomplete": true, "reason": ...} (build_end).
  bool read_ours() {
    Reader::Head v;
    if (!r_.head(v)) return false;
    if (v.major != 5 || v.indefinite) return r_.skip_body(v, 1);
    if (v.arg > r_.left() / 2) return r_.fail_sizes();
    for (std::uint64_t j = 0; j < v.arg; ++j) {
      std::string_view key;
      bool is_text = false;
      if (!read_key(key, is_text, 2)) return false;
      if (!is_text || key != "reason") {
        if (!r_.skip(2)) return false;
        continue;
      }
      Reader::Head w;
      std::string_view why;
      if (!r_.head(w)) return false;
      if (r_.text(w, why)) {
        m_.incomplete = std::string(why.substr(0, 512));
      } else if (!r_.error().empty() || !r_.skip_body(w, 2)) {
        return false;
      }
    }
    return true;
  }

  Reader& r_;
  std::string& error_;
  Message m_;
  std::optional<std::string_view> type_, unique_;
  std::optional<std::uint64_t> series_id_, image_id_;
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
  RoutingFields fields(r, error);
  if (!fields.read(h.arg)) {
    if (!r.error().empty()) error = r.error();
    return std::nullopt;
  }
  if (r.left() > 0) {
    error = std::to_string(r.left()) + " bytes after the CBOR item";
    return std::nullopt;
  }
  return fields.message();
}

}  // namespace numastream::stream2
