#include "wire/tracker.hpp"

#include <gtest/gtest.h>

namespace numastream {
namespace {

wire::Header eos_header(std::uint32_t stream, std::uint16_t conn, std::uint16_t conns) {
  wire::Header h;
  h.type = wire::FrameType::end_of_stream;
  h.stream_id = stream;
  h.connection = conn;
  h.connections = conns;
  return h;
}

TEST(StreamTracker, CountsDeliveredDuplicateCorruptAndLost) {
  StreamTracker t;
  for (std::uint64_t s : {0, 1, 2, 4, 6, 7}) {
    EXPECT_EQ(t.on_chunk(0, s, true, 100), StreamTracker::Verdict::delivered);
  }
  EXPECT_EQ(t.on_chunk(0, 2, true, 100), StreamTracker::Verdict::duplicate);
  EXPECT_EQ(t.on_chunk(0, 8, false, 100), StreamTracker::Verdict::corrupt);
  t.on_end_of_stream(eos_header(0, 0, 2), {10, 1000, 5});
  EXPECT_EQ(t.complete_streams(), 0) << "one of two connections ended";
  t.on_end_of_stream(eos_header(0, 1, 2), {10, 1000, 5});
  EXPECT_EQ(t.complete_streams(), 1);
  auto tot = t.totals();
  EXPECT_EQ(tot.delivered, 6u);
  EXPECT_EQ(tot.duplicates, 1u);
  EXPECT_EQ(tot.corrupt, 1u);
  EXPECT_EQ(tot.lost, 3u) << "3, 5 and 9 never arrived (8 arrived corrupt)";
  EXPECT_EQ(tot.raw_bytes, 600u);
  EXPECT_TRUE(tot.complete);
  auto j = t.streams_json();
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["missing"], (nlohmann::json{"3", "5", "8-9"}));
  EXPECT_EQ(j[0]["expected_chunks"], 10);
}

TEST(StreamTracker, WithoutEndOfStreamGapsBelowTheHighestSequenceCount) {
  StreamTracker t;
  t.on_chunk(3, 0, true, 1);
  t.on_chunk(3, 5, true, 1);
  auto tot = t.totals();
  EXPECT_EQ(tot.lost, 4u);
  EXPECT_FALSE(tot.complete);
}

TEST(StreamTracker, StreamsAreIndependent) {
  StreamTracker t;
  t.on_chunk(1, 0, true, 1);
  t.on_chunk(2, 0, true, 1);
  EXPECT_EQ(t.totals().duplicates, 0u);
  t.on_end_of_stream(eos_header(1, 0, 1), {1, 1, 1});
  EXPECT_EQ(t.complete_streams(), 1);
  EXPECT_FALSE(t.totals().complete) << "stream 2 has not ended";
}

TEST(StreamTracker, UnwrittenChunksCountAsLost) {
  StreamTracker t;
  t.on_chunk(0, 0, true, 1);
  t.on_unwritten(0, 0);
  t.on_end_of_stream(eos_header(0, 0, 1), {1, 1, 1});
  EXPECT_EQ(t.totals().lost, 1u);
}

TEST(StreamTracker, LargeSequenceNumbersGrowTheBitmap) {
  StreamTracker t;
  EXPECT_EQ(t.on_chunk(0, 1'000'000, true, 1), StreamTracker::Verdict::delivered);
  EXPECT_EQ(t.on_chunk(0, 1'000'000, true, 1), StreamTracker::Verdict::duplicate);
}

}  // namespace
}  // namespace numastream
