#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "detector/stream2.hpp"

namespace numastream {
namespace {

std::optional<stream2::Message> parse(const std::string& bytes, std::string& error) {
  return stream2::parse(std::as_bytes(std::span(bytes.data(), bytes.size())), error);
}

// The bytes of a string literal, embedded NULs included.
template <std::size_t N>
std::string B(const char (&s)[N]) {
  return std::string(s, N - 1);
}

TEST(Stream2Parse, OurStartMessageReadsBack) {
  auto start = stream2::build_start(42, "01SERIES", 10);
  std::string error;
  auto m = stream2::parse(start, error);
  ASSERT_TRUE(m) << error;
  EXPECT_EQ(m->type, stream2::Type::start);
  EXPECT_EQ(m->series_id, 42u);
  EXPECT_EQ(m->series_unique_id, "01SERIES");
  EXPECT_EQ(std::to_integer<int>(start[0]), 0xd9)
      << "tagged as self-described CBOR, as detectors do";
}

TEST(Stream2Parse, RefusalsSayWhy) {
  struct Case {
    std::string bytes, why;
  } cases[] = {
      {"", "empty message"},
      {"not CBOR", "not CBOR"},
      {std::string("\x83\x01\x02\x03", 4), "not a CBOR map"},
      {std::string("\xa1\x61x\x01", 4), "no type field"},
      {std::string("\xa0\xa0", 2), "bytes after the CBOR item"},
      {std::string("\xa2\x64type\x65image\x69series_id\x07", 23), "image message without image_id"},
      {std::string("\xa2\x64type\x63"
                   "end\x69series_id\x61x",
                   22),
       "series_id is not an unsigned integer"},
      {std::string("\xa1\x64type\x64scan", 11), "unknown type \"scan\""},
      // A map header declaring 1.8 billion entries in a few bytes: refused, not allocated.
      {std::string("\xd9\xd9\xf7\xba\x6c\x69\x6d\x61\x00", 9),
       "declares more items than the message has bytes"},
  };
  for (const auto& c : cases) {
    std::string error;
    EXPECT_FALSE(parse(c.bytes, error)) << c.why;
    EXPECT_NE(error.find(c.why), std::string::npos) << "got: " << error;
  }
}

// The worst well-formed and malformed values a detector socket could carry: each is refused or
// read without reading outside the message, recursing without bound or allocating by what a
// header declares.
TEST(Stream2Parse, HostileMessagesAreRefusedOrSkippedWithinTheirBytes) {
  // 100000 nested arrays around nothing, as a field's value: a depth limit, not a stack overflow.
  std::string deep = B("\xa2\x64type\x63"
                       "end\x63"
                       "abc") +
                     std::string(100000, '\x81') + '\x00';
  // A byte string declaring 2^63 bytes: truncated, not allocated or read past the end.
  std::string huge =
      B("\xa1\x63"
        "abc\x5b\x80\x00\x00\x00\x00\x00\x00\x00");
  // An indefinite map at the top and a break where no item is open.
  std::string indefinite =
      B("\xbf\x64type\x63"
        "end\xff");
  std::string stray_break =
      B("\xa1\x63"
        "abc\xff");
  // An array declaring more items than the bytes left, deep inside an otherwise valid message.
  std::string sizes =
      B("\xa1\x63"
        "abc\x9b\x00\x00\x00\x01\x00\x00\x00\x00");
  struct Case {
    std::string bytes, why;
  } cases[] = {
      {deep, "nested deeper than 64"},
      {huge, "truncated"},
      {indefinite, "not a CBOR map"},
      {stray_break, "a break outside an indefinite item"},
      {sizes, "declares more items than the message has bytes"},
      {B("\xa1\x63"
         "abc\x1c"),
       "malformed"},  // reserved additional information 28
  };
  for (const auto& c : cases) {
    std::string error;
    EXPECT_FALSE(parse(c.bytes, error)) << c.why;
    EXPECT_NE(error.find(c.why), std::string::npos) << "got: " << error;
  }
}

// What parse() skips it never looks into: an image message whose fields come in any order, with
// indefinite-length strings, tags, floats, nested maps and a key that is not a text string,
// routes as its routing fields say, and numastream's own end message gives its reason.
TEST(Stream2Parse, EveryKindOfItemBetweenTheRoutingFieldsIsSkipped) {
  std::string msg("\xd9\xd9\xf7\xa8", 4);  // tag 55799, a map of 8
  msg += B("\x01\x02");                    // 1: 2 (not a text key)
  msg +=
      B("\x64"
        "data\xa1\x62"
        "c1\xd8\x28\x82\x82\x02\x02\x44\x01\x02\x03\x04");  // tag 40 [[2,2], h'01020304']
  msg += B("\x68image_id\x18\x2a");                         // image_id: 42
  msg +=
      B("\x63"
        "now\xfb\x40\x09\x21\xfb\x54\x44\x2d\x18");  // now: 3.14159...
  msg += B("\x64type\x65image");                     // type: "image"
  msg +=
      B("\x61"
        "s\x7f\x62"
        "ab\x61"
        "c\xff");                          // s: (_ "ab", "c")
  msg += B("\x69series_id\x07");           // series_id: 7
  msg += B("\x70series_unique_id\x62u7");  // series_unique_id: "u7"
  std::string error;
  auto m = parse(msg, error);
  ASSERT_TRUE(m) << error;
  EXPECT_EQ(m->type, stream2::Type::image);
  EXPECT_EQ(m->series_id, 7u);
  EXPECT_EQ(m->image_id, 42u);
  EXPECT_EQ(m->series_unique_id, "u7");

  auto end = stream2::build_end(7, "u7", "the detector went away");
  auto e = stream2::parse(end, error);
  ASSERT_TRUE(e) << error;
  EXPECT_EQ(e->type, stream2::Type::end);
  EXPECT_EQ(e->incomplete, "the detector went away");
}

struct Walked {
  std::map<std::string, stream2::Value> fields;  // arrays' spans are not kept
  std::vector<std::string> skipped;
  std::string error;
  bool ok = false;
};

Walked walk(std::span<const std::byte> message) {
  Walked w;
  w.ok = stream2::walk(
      message,
      [&](const std::string& path, const stream2::Value& v) {
        w.fields[path] = v;
        w.fields[path].array.bytes = {};
        w.fields[path].s = {};
        w.fields[path].texts.assign(v.texts.size(), {});
      },
      w.skipped, w.error);
  return w;
}

TEST(Stream2Walk, AnImageMessageGivesEachChannelAsTheDetectorCompressedIt) {
  // A bslz4 frame's framing starts with the uncompressed size (8 bytes, big-endian): 3x4 uint16.
  std::vector<std::byte> b(20);
  b[7] = std::byte{24};
  auto image = stream2::build_image(3, "u3", 9, {3, 4}, "uint16", stream2::Compression::bslz4,
                                    {{"threshold_1", b}, {"difference", b}});
  Walked w = walk(image);
  ASSERT_TRUE(w.ok) << w.error;
  EXPECT_EQ(w.fields.at("image_id").u, 9u);
  const auto& ch = w.fields.at("data/threshold_1");
  EXPECT_EQ(ch.kind, stream2::Value::Kind::array);
  EXPECT_EQ(ch.array.dims, (std::vector<std::uint64_t>{3, 4}));
  EXPECT_EQ(ch.array.dtype, "uint16");
  EXPECT_EQ(ch.array.compression, stream2::Compression::bslz4);
  EXPECT_EQ(ch.array.elem_size, 2u);
  EXPECT_TRUE(w.fields.count("data/difference"));
  EXPECT_TRUE(w.skipped.empty());
}

TEST(Stream2Walk, AStartMessageGivesItsMetadataAndPixelMasks) {
  stream2::StartInfo info;
  info.series_id = 5;
  info.series_unique_id = "u5";
  info.number_of_images = 10;
  info.dims = {2, 3};
  info.channels = {"threshold_1", "threshold_2"};
  info.beam_center_x = 1.5;
  info.arm_date = "2026-11-28T01:02:03.456Z";
  const auto start = stream2::build_start(info);
  Walked w = walk(start);
  ASSERT_TRUE(w.ok) << w.error;
  EXPECT_EQ(w.skipped, std::vector<std::string>{});
  // arm_date, a tag 0 date/time as Stream V2 sends it, is text.
  std::string arm_date;
  std::vector<std::string> skipped;
  std::string error;
  stream2::walk(
      start,
      [&](const std::string& path, const stream2::Value& v) {
        if (path == "arm_date") arm_date = std::string(v.s);
      },
      skipped, error);
  EXPECT_EQ(arm_date, "2026-11-28T01:02:03.456Z");
  EXPECT_EQ(w.fields.at("sensor_material").kind, stream2::Value::Kind::text);
  EXPECT_EQ(w.fields.at("detector_translation").reals, (std::vector<double>{0, 0, 0.12}));
  EXPECT_EQ(w.fields.at("number_of_images").u, 10u);
  EXPECT_EQ(w.fields.at("beam_center_x").d, 1.5);
  EXPECT_EQ(w.fields.at("pixel_mask_enabled").b, true);
  EXPECT_EQ(w.fields.at("channels").kind, stream2::Value::Kind::texts);
  EXPECT_EQ(w.fields.at("channels").texts.size(), 2u);
  const auto& mask = w.fields.at("pixel_mask/threshold_2");
  EXPECT_EQ(mask.array.dtype, "uint32");
  EXPECT_EQ(mask.array.dims, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(mask.array.compression, stream2::Compression::none);
}

TEST(Stream2Walk, MalformedArraysAreRefusedWithTheirPath) {
  // 3x4 uint16 = 24 bytes; 20 uncompressed bytes do not fill it.
  std::vector<std::byte> short_frame(20);
  auto image = stream2::build_image(1, "u", 0, {3, 4}, "uint16", stream2::Compression::none,
                                    {{"t1", short_frame}});
  Walked w = walk(image);
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.error.find("data/t1: 20 bytes of uint16 do not fill its dimensions"),
            std::string::npos)
      << w.error;
  // A compressed frame whose framing states another size.
  std::vector<std::byte> framed(16);
  framed[7] = std::byte{30};
  w = walk(stream2::build_image(1, "u", 0, {3, 4}, "uint16", stream2::Compression::lz4,
                                {{"t1", framed}}));
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.error.find("data/t1: 30 bytes"), std::string::npos) << w.error;
  // Dimensions whose product wraps round to what the framing claims (2^32 x 2^32 x 2 bytes = 2^65:
  // 0 modulo 2^64, and the framing says 0) are refused, not taken for an empty array.
  std::vector<std::byte> empty(16);
  w = walk(stream2::build_image(1, "u", 0, {1ull << 32, 1ull << 32}, "uint16",
                                stream2::Compression::lz4, {{"t1", empty}}));
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.error.find("data/t1: dimensions of more than 2^48 elements"), std::string::npos)
      << w.error;
}

}  // namespace
}  // namespace numastream
