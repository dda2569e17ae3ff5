#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace numastream
