// The live preview: frames drawn as pictures (binning, the log colour scale, masked pixels, the
// PNG), and what the /preview endpoints answer for raw, compressed and Stream V2 frames and for
// what they cannot show.
#include "pipeline/preview.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "codec/codec.hpp"
#include "codec/hdf5_lz4.hpp"
#include "detector/stream2.hpp"
#include "obs/image.hpp"

namespace numastream {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> u16(const std::vector<std::uint16_t>& v) {
  std::vector<std::byte> out(v.size() * 2);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::array<std::uint8_t, 3> at(const image::Rgb& img, std::size_t row, std::size_t col) {
  const std::uint8_t* p = &img.pixels[(row * img.width + col) * 3];
  return {p[0], p[1], p[2]};
}

std::array<std::uint8_t, 3> scale(double t) {
  std::array<std::uint8_t, 3> c{};
  image::colour(t, c.data());
  return c;
}

// A 256 x 256 frame: 1 count on the left, 10000 on the right, a masked 32 x 32 corner.
std::vector<std::uint16_t> pattern() {
  std::vector<std::uint16_t> f(256 * 256);
  for (std::size_t r = 0; r < 256; ++r) {
    for (std::size_t c = 0; c < 256; ++c)
      f[r * 256 + c] = r < 32 && c < 32 ? 0xffff : c < 128 ? 1 : 10000;
  }
  return f;
}

TEST(PreviewImage, BinsToFitMarksMaskedPixelsAndScalesLogarithmically) {
  const auto frame = u16(pattern());
  const image::Rgb img = image::render(frame, "uint16", 256, 256, 100);  // 3 x 3 blocks
  EXPECT_EQ(img.width, 86u);
  EXPECT_EQ(img.height, 86u);
  const auto masked =
      std::array<std::uint8_t, 3>{image::kMasked[0], image::kMasked[1], image::kMasked[2]};
  EXPECT_EQ(at(img, 0, 0), masked);
  EXPECT_EQ(at(img, 9, 9), masked);    // rows and cols 27-29: all masked
  EXPECT_NE(at(img, 10, 10), masked);  // 30-32: partly, shown as the rest of the block
  EXPECT_EQ(at(img, 50, 10), scale(0));
  EXPECT_EQ(at(img, 50, 80), scale(1));
  // Block 42 holds cols 126, 127 (1 count) and 128 (10000): mean 3334, log-scaled.
  EXPECT_EQ(at(img, 50, 42), scale(std::log1p((1 + 1 + 10000) / 3.0 - 1) / std::log1p(10000 - 1)));
}

TEST(PreviewImage, RefusesBytesThatAreNotTheFrameItIsToldAndUnknownTypes) {
  const auto frame = u16(pattern());
  EXPECT_THROW(image::render(std::span(frame).first(1000), "uint16", 256, 256, 512),
               std::invalid_argument);
  EXPECT_THROW(image::render(frame, "complex64", 256, 128, 512), std::invalid_argument);
  EXPECT_THROW(image::render(frame, "uint16", 0, 256, 512), std::invalid_argument);
  // rows x cols that overflow must not pass the size check.
  EXPECT_THROW(image::render(frame, "uint16", std::size_t{1} << 62, 4, 512), std::invalid_argument);
  // A frame of NaNs (floats) is all masked; one of a single value all the scale's bottom.
  std::vector<float> nans(16, std::numeric_limits<float>::quiet_NaN());
  std::vector<std::byte> nb(nans.size() * 4);
  std::memcpy(nb.data(), nans.data(), nb.size());
  const image::Rgb all = image::render(nb, "float32", 4, 4, 512);
  EXPECT_EQ(at(all, 3, 3),
            (std::array<std::uint8_t, 3>{image::kMasked[0], image::kMasked[1], image::kMasked[2]}));
  const image::Rgb flat =
      image::render(u16(std::vector<std::uint16_t>(16, 7)), "uint16", 4, 4, 512);
  EXPECT_EQ(at(flat, 2, 2), scale(0));
}

TEST(PreviewImage, ThePngHoldsTheImageAsZlibWroteIt) {
  image::Rgb img;
  img.width = 3;
  img.height = 2;
  for (int i = 0; i < 18; ++i) img.pixels.push_back(static_cast<std::uint8_t>(i * 10));
  const std::string png = image::png(img);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  // IDAT: the rows, each after its filter byte (0), deflated.
  const auto idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  const std::uint32_t len = (std::uint8_t(png[idat - 4]) << 24) |
                            (std::uint8_t(png[idat - 3]) << 16) |
                            (std::uint8_t(png[idat - 2]) << 8) | std::uint8_t(png[idat - 1]);
  std::string raw(2 * (1 + 9), '\0');
  uLongf n = raw.size();
  ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(raw.data()), &n,
                       reinterpret_cast<const Bytef*>(png.data() + idat + 4), len),
            Z_OK);
  ASSERT_EQ(n, raw.size());
  EXPECT_EQ(raw[0], 0);
  EXPECT_EQ(std::uint8_t(raw[1 + 8]), 80);
  EXPECT_EQ(std::uint8_t(raw[10 + 1 + 8]), 170);
  EXPECT_EQ(png.substr(png.size() - 8, 4), "IEND");
}

HttpReply get(Preview& p, const std::string& path) {
  auto r = p.answer(path);
  if (!r) return HttpReply{404, "", "(not a preview path)"};
  return *r;
}

const std::string kMeta = R"({"dtype":"uint16","shape":[256,256]})";

TEST(Preview, ServesTheLatestFrameOfEachStreamAtMostEveryInterval) {
  Preview p(512, 200ms);
  const auto frame = u16(pattern());
  EXPECT_EQ(get(p, "/preview/stream/0.png").code, 404) << "no frame yet";
  ASSERT_TRUE(p.due(0, frame.size()));
  p.offer(0, 7, Codec::none, 0, frame.size(), frame, kMeta);
  EXPECT_FALSE(p.due(0, frame.size())) << "a frame was taken less than the interval ago";
  EXPECT_TRUE(p.due(3, frame.size())) << "each stream has its own";
  const HttpReply png = get(p, "/preview/stream/0.png");
  EXPECT_EQ(png.code, 200);
  EXPECT_EQ(png.type, "image/png");
  EXPECT_EQ(png.body, image::png(image::render(frame, "uint16", 256, 256, 512)));
  const auto streams = nlohmann::json::parse(get(p, "/preview/streams.json").body);
  ASSERT_EQ(streams.size(), 1u) << streams.dump();  // stream 3 has no frame yet
  EXPECT_EQ(streams[0]["stream"], 0);
  EXPECT_EQ(streams[0]["sequence"], 7);
  EXPECT_EQ(streams[0]["rows"], 256);
  EXPECT_EQ(streams[0]["frames"], 2);
  EXPECT_EQ(streams[0]["raw_bytes"], 2 * frame.size());
  EXPECT_EQ(get(p, "/preview").type, "text/html; charset=utf-8");
  std::this_thread::sleep_for(250ms);
  EXPECT_TRUE(p.due(0, frame.size()));
}

TEST(Preview, DecodesCompressedFramesAndStreamV2Images) {
  const auto frame = u16(pattern());
  const std::string expected = image::png(image::render(frame, "uint16", 256, 256, 512));
  for (Codec codec : {Codec::bslz4, Codec::lz4}) {
    Compressor comp(codec, 1, frame.size(), 2);
    std::vector<std::byte> packed(max_encoded_size(frame.size()));
    auto r = comp.compress(frame, packed);
    ASSERT_EQ(r.codec, codec);
    packed.resize(r.size);
    Preview p(512, 0ms);
    p.offer(1, 0, codec, 2, frame.size(), packed, kMeta);
    EXPECT_EQ(get(p, "/preview/stream/1.png").body, expected) << codec_name(codec);
  }
  // A Stream V2 image message: its first channel, decoded from the detector's bslz4.
  Compressor comp(Codec::bslz4, 1, frame.size(), 2);
  std::vector<std::byte> packed(max_encoded_size(frame.size()));
  packed.resize(comp.compress(frame, packed).size);
  const auto message = stream2::build_image(5, "u5", 11, {256, 256}, "uint16",
                                            stream2::Compression::bslz4, {{"threshold_1", packed}});
  Preview p(512, 0ms);
  const auto start = stream2::build_start(5, "u5", 100);
  p.offer(2, 39, Codec::none, 0, start.size(), start, R"({"dtype":"stream2"})");
  EXPECT_EQ(get(p, "/preview/stream/2.png").code, 404) << "a start message is no image";
  ASSERT_TRUE(p.due(2, message.size())) << "the next message is due";
  p.offer(2, 40, Codec::none, 0, message.size(), message, R"({"dtype":"stream2"})");
  EXPECT_EQ(get(p, "/preview/stream/2.png").body, expected);
  // LZ4 in the HDF5 filter's framing (32004), beside a channel it does not show.
  const auto framed = hdf5_lz4::encode(frame);
  const auto lz4_message =
      stream2::build_image(5, "u5", 12, {256, 256}, "uint16", stream2::Compression::lz4,
                           {{"difference", framed}, {"threshold_1", framed}});
  p.offer(2, 41, Codec::none, 0, lz4_message.size(), lz4_message, R"({"dtype":"stream2"})");
  EXPECT_EQ(get(p, "/preview/stream/2.png").body, expected);
}

// What it cannot show is said, and never takes the server down.
TEST(Preview, AnswersWhatItCannotShowWithTheReason) {
  Preview p(512, 0ms);
  const auto frame = u16(pattern());
  p.offer(0, 0, Codec::lz4, 2, frame.size(), frame, kMeta);  // not lz4 at all
  HttpReply r = get(p, "/preview/stream/0.png");
  EXPECT_EQ(r.code, 503);
  EXPECT_NE(r.body.find("does not decode"), std::string::npos) << r.body;
  p.offer(1, 0, Codec::none, 0, 5, std::span(frame).first(5), R"({"dtype":"stream2"})");
  r = get(p, "/preview/stream/1.png");
  EXPECT_EQ(r.code, 503);
  EXPECT_NE(r.body.find("not a Stream V2 message"), std::string::npos) << r.body;
  p.offer(2, 0, Codec::none, 0, frame.size(), frame, "");
  EXPECT_NE(get(p, "/preview/stream/2.png").body.find("pixel type is unknown"), std::string::npos);
  const auto streams = nlohmann::json::parse(get(p, "/preview/streams.json").body);
  ASSERT_EQ(streams.size(), 3u);
  EXPECT_NE(streams[0]["error"].get<std::string>().find("does not decode"), std::string::npos);
  for (const char* path :
       {"/preview/stream/x.png", "/preview/stream/.png", "/preview/stream/99999999999.png",
        "/preview/stream/4294967296.png", "/preview/stream/9.png", "/preview/stream/0.jpg"}) {
    EXPECT_EQ(get(p, path).code, 404) << path;
  }
  EXPECT_FALSE(p.answer("/metrics")) << "not the preview's";
  // A well-formed message whose framing claims a frame of 2^40 bytes is not decoded into memory.
  std::vector<std::byte> huge(16);
  huge[2] = std::byte{1};  // 2^40 raw bytes, big-endian
  const auto claim = stream2::build_image(1, "u", 0, {1u << 20, 1u << 19}, "uint16",
                                          stream2::Compression::lz4, {{"t1", huge}});
  p.offer(4, 0, Codec::none, 0, claim.size(), claim, R"({"dtype":"stream2"})");
  r = get(p, "/preview/stream/4.png");
  EXPECT_EQ(r.code, 503);
  EXPECT_NE(r.body.find("more than the preview draws"), std::string::npos) << r.body;
  // A frame whose shape is wider than the chunk (a last short chunk) is drawn with what there is.
  p.offer(3, 0, Codec::none, 0, 256 * 100 * 2, std::span(frame).first(256 * 100 * 2), kMeta);
  const auto s3 = nlohmann::json::parse(get(p, "/preview/streams.json").body)[3];
  EXPECT_EQ(s3["rows"], 100);
  EXPECT_EQ(s3["error"], nullptr);
}

}  // namespace
}  // namespace numastream
