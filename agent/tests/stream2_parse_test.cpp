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

TEST(Stream2Parse, OurStartMessageReadsBack) {
  auto start = stream2::build_start(42, "01SERIES", 10);
  std::string error;
  auto m = stream2::parse(start, error);
  ASSERT_TRUE(m) << error;
  EXPECT_EQ(m->type, stream2::Type::start);
  EXPECT_EQ(m->series_id, 42u);
  EXPECT_EQ(m->series_unique_id, "01SERIES");
  EXPECT_EQ(std::to_integer<int>(start[0]), 0xd9) << "tagged as self-described CBOR, as detectors do";
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
      {std::string("\xa2\x64type\x63" "end\x69series_id\x61x", 22), "series_id is not an unsigned integer"},
      {std::string("\xa1\x64type\x64scan", 11), "unknown type \"scan\""},
      // A map header declaring 1.8 billion entries in a few bytes: refused, not allocated.
      {std::string("\xd9\xd9\xf7\xba\x6c\x69\x6d\x61\x00", 9), "declares more items than the message has bytes"},
  };
  for (const auto& c : cases) {
    std::string error;
    EXPECT_FALSE(parse(c.bytes, error)) << c.why;
    EXPECT_NE(error.find(c.why), std::string::npos) << "got: " << error;
  }
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
      message, [&](const std::string& path, const stream2::Value& v) { 
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
  Walked w = walk(stream2::build_start(info));
  ASSERT_TRUE(w.ok) << w.error;
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
  auto image = stream2::build_image(1, "u", 0, {3, 4}, "uint16", stream2::Compression::none, {{"t1", short_frame}});
  Walked w = walk(image);
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.error.find("data/t1: 20 bytes of uint16 do not fill its dimensions"), std::string::npos) << w.error;
  // A compressed frame whose framing states another size.
  std::vector<std::byte> framed(16);
  framed[7] = std::byte{30};
  w = walk(stream2::build_image(1, "u", 0, {3, 4}, "uint16", stream2::Compression::lz4, {{"t1", framed}}));
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.error.find("data/t1: 30 bytes"), std::string::npos) << w.error;
}

}  // namespace
}  // namespace numastream
