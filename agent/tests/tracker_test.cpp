#include "wire/tracker.hpp"

#include <gtest/gtest.h>

#include <random>

#include "data/seqset.hpp"

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

// The worst well-formed values a peer can put in a frame: what the record holds stays bounded by
// its configuration, and each is refused with a reason.
TEST(StreamTracker, AFarAheadSequenceIsRefusedAndHoldsNothing) {
  StreamTracker t(4, 1 << 16);
  EXPECT_EQ(t.admit(0, 0), wire::DecodeError::ok);
  EXPECT_EQ(t.admit(0, std::uint64_t{1} << 40), wire::DecodeError::out_of_window);
  EXPECT_EQ(t.admit(0, ~std::uint64_t{0}), wire::DecodeError::out_of_window);
  EXPECT_EQ(t.admit(0, (1 << 16) - 1), wire::DecodeError::ok) << "the last sequence of the window";
  EXPECT_EQ(t.admit(0, 1 << 16), wire::DecodeError::out_of_window);
  EXPECT_EQ(t.on_chunk(0, (1 << 16) - 1, true, 1), StreamTracker::Verdict::delivered);
  EXPECT_LE(t.held_bytes(), (1u << 16) / 8) << "a window of bits, no more";
  // An honest stream fills the hole and the window moves on.
  for (std::uint64_t q = 0; q < (1 << 16) - 1; ++q) t.on_chunk(0, q, true, 1);
  EXPECT_EQ(t.admit(0, (1 << 17) - 1), wire::DecodeError::ok);
  EXPECT_EQ(t.held_bytes(), 0u) << "a contiguous stream holds no bits";
}

TEST(StreamTracker, APermanentHoleHoldsAtMostTheWindow) {
  StreamTracker t(4, 1 << 12);
  // Sequence 0 never comes; everything the window allows after it does.
  std::uint64_t refused = 0;
  for (std::uint64_t q = 1; q < 3 * (1 << 12); ++q) {
    if (t.admit(0, q) != wire::DecodeError::ok) {
      ++refused;
      continue;
    }
    t.on_chunk(0, q, true, 1);
  }
  EXPECT_EQ(refused, 2u * (1 << 12)) << "everything past the window, while the hole stays";
  EXPECT_LE(t.held_bytes(), (1u << 12) / 8);
  // Declared gone: the window moves, nothing was lost silently.
  const wire::Gap g{0, 1, wire::GapReason::spill_full};
  EXPECT_EQ(t.on_gaps(0, {&g, 1}), wire::DecodeError::ok);
  EXPECT_EQ(t.admit(0, 1 << 12), wire::DecodeError::ok);
  EXPECT_EQ(t.totals().declared_missing, 1u);
  EXPECT_EQ(t.totals().lost, 1u);
}

TEST(StreamTracker, StreamIdsPastTheLimitAreRefused) {
  StreamTracker t(3);
  for (std::uint32_t id = 0; id < 3; ++id) EXPECT_EQ(t.admit(id, 0), wire::DecodeError::ok);
  std::mt19937 rng(5);
  for (int i = 0; i < 10000; ++i)
    EXPECT_EQ(t.admit_stream(rng() | 8u), wire::DecodeError::too_many_streams);
  EXPECT_EQ(t.admit(1, 1), wire::DecodeError::ok) << "the streams it holds go on";
  EXPECT_EQ(t.streams_json().size(), 3u);
}

TEST(StreamTracker, ResumeFloorsAndListsStayInTheWindow) {
  StreamTracker t(4, 1 << 16);
  // A stream the receiver has not seen may start anywhere (a receiver replaced mid-stream).
  EXPECT_EQ(t.on_resume(0, 5'000'000'000ull, {}), wire::DecodeError::ok);
  EXPECT_EQ(t.totals().delivered_before, 5'000'000'000ull);
  EXPECT_EQ(t.held_bytes(), 0u);
  // Once known, a floor moves only within its window, and a listed sequence must be in it.
  EXPECT_EQ(t.on_resume(0, std::uint64_t{1} << 40, {}), wire::DecodeError::out_of_window);
  const std::vector<std::uint64_t> far = {5'000'000'000ull + (1 << 16)};
  EXPECT_EQ(t.on_resume(0, 5'000'000'000ull, far), wire::DecodeError::out_of_window);
  std::vector<std::uint64_t> many(65536);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = 5'000'000'000ull + 1 + i;
  many.back() = 5'000'000'000ull + (1 << 16) - 1;
  EXPECT_EQ(t.on_resume(0, 5'000'000'000ull, many), wire::DecodeError::ok);
  EXPECT_LE(t.held_bytes(), 2 * (1u << 16) / 8)
      << "two windows of bits: settled, and of those resumed";
  EXPECT_EQ(t.admit(0, 5'000'000'000ull), wire::DecodeError::ok);
}

// A far floor after a data frame was taken is refused, even before that frame is decoded (the
// decompressing threads run later than the receiving thread that admits frames).
TEST(StreamTracker, AFloorCannotJumpOnceAFrameOfTheStreamWasTaken) {
  StreamTracker t(4, 1 << 16);
  EXPECT_EQ(t.admit(7, 0), wire::DecodeError::ok);
  EXPECT_EQ(t.on_resume(7, std::uint64_t{1} << 40, {}), wire::DecodeError::out_of_window);
  StreamTracker u(4, 1 << 16);
  EXPECT_EQ(u.on_resume(7, 0, {}), wire::DecodeError::ok);
  EXPECT_EQ(u.on_resume(7, std::uint64_t{1} << 40, {}), wire::DecodeError::out_of_window);
  const std::vector<wire::Gap> below = {{2, std::uint64_t{1} << 40, wire::GapReason::spill_full}};
  EXPECT_EQ(u.on_gaps(7, below), wire::DecodeError::out_of_window);
  EXPECT_EQ(u.on_resume(7, SeqSet::kMaxSeq + 1, {}), wire::DecodeError::out_of_window);
}

TEST(StreamTracker, ForgedEndOfStreamTotalsAreRefused) {
  StreamTracker t;
  for (std::uint64_t q = 0; q < 10; ++q) t.on_chunk(0, q, true, 1);
  EXPECT_EQ(t.on_end_of_stream(eos_header(0, 0, 2), {4, 4, 4}),
            wire::DecodeError::contradicts_stream)
      << "10 chunks arrived: a total of 4 would publish a truncated file";
  EXPECT_EQ(t.on_end_of_stream(eos_header(0, 0, 2), {std::uint64_t{1} << 40, 1, 1}),
            wire::DecodeError::out_of_window);
  EXPECT_EQ(t.on_end_of_stream(eos_header(0, 0, 2), {12, 12, 6}), wire::DecodeError::ok);
  EXPECT_EQ(t.on_end_of_stream(eos_header(0, 1, 2), {11, 11, 5}),
            wire::DecodeError::contradicts_stream)
      << "the other connection announced 12";
  EXPECT_EQ(t.on_end_of_stream(eos_header(0, 1, 3), {12, 12, 5}),
            wire::DecodeError::contradicts_stream)
      << "the connection count changed";
  EXPECT_EQ(t.admit(0, 12), wire::DecodeError::out_of_window) << "past the announced end";
  EXPECT_EQ(t.on_end_of_stream(eos_header(0, 1, 2), {12, 12, 6}), wire::DecodeError::ok);
  EXPECT_EQ(t.totals().lost, 2u);
  EXPECT_TRUE(t.totals().complete);
}

TEST(StreamTracker, DeclaredGapsAreMissingNamedAndNotCountedTwice) {
  StreamTracker t;
  for (std::uint64_t q = 0; q < 5; ++q) t.on_chunk(0, q, true, 1);
  const std::vector<wire::Gap> gaps = {{5, 9, wire::GapReason::sender_restarted}};
  EXPECT_EQ(t.on_gaps(0, gaps), wire::DecodeError::ok);
  EXPECT_EQ(t.on_gaps(0, gaps), wire::DecodeError::ok) << "declared again after a reconnect";
  EXPECT_EQ(t.past_gaps(0, 5), 9u);
  EXPECT_EQ(t.past_gaps(0, 9), 9u);
  for (std::uint64_t q = 9; q < 12; ++q) t.on_chunk(0, q, true, 1);
  t.on_end_of_stream(eos_header(0, 0, 1), {12, 12, 3});
  auto tot = t.totals();
  EXPECT_EQ(tot.delivered, 8u);
  EXPECT_EQ(tot.declared_missing, 4u);
  EXPECT_EQ(tot.lost, 4u);
  auto j = t.streams_json();
  EXPECT_EQ(j[0]["missing"], (nlohmann::json{"5-8"}));
  EXPECT_EQ(j[0]["gaps"][0]["reason"], "sender_restarted");
  EXPECT_EQ(j[0]["gaps"][0]["chunks"], 4);
  // Far-ahead and huge gaps are refused.
  const std::vector<wire::Gap> far = {
      {std::uint64_t{1} << 40, (std::uint64_t{1} << 40) + 1, wire::GapReason::spill_full}};
  EXPECT_EQ(t.on_gaps(0, far), wire::DecodeError::out_of_window);
  const std::vector<wire::Gap> late = {{12, 13, wire::GapReason::spill_full}};
  EXPECT_EQ(t.on_gaps(0, late), wire::DecodeError::contradicts_stream) << "past the announced end";
  StreamTracker u(4, 1 << 16);
  const std::vector<wire::Gap> huge = {{0, std::uint64_t{1} << 40, wire::GapReason::spill_full}};
  EXPECT_EQ(u.on_gaps(0, huge), wire::DecodeError::out_of_window);
  EXPECT_EQ(u.on_gaps(0, far), wire::DecodeError::out_of_window);
}

TEST(StreamTracker, ARestartedReceiverLearnsTheGapAgainAndDoesNotCallItDelivered) {
  StreamTracker t;
  // The sender's record: 0-19 settled, of which 10-14 were declared gone.
  EXPECT_EQ(t.on_resume(0, 20, {}), wire::DecodeError::ok);
  EXPECT_EQ(t.totals().delivered_before, 20u);
  const wire::Gap g{10, 15, wire::GapReason::sender_restarted};
  EXPECT_EQ(t.on_gaps(0, {&g, 1}), wire::DecodeError::ok);
  EXPECT_EQ(t.totals().delivered_before, 15u);
  t.on_end_of_stream(eos_header(0, 0, 1), {20, 20, 0});
  EXPECT_EQ(t.totals().lost, 5u);
}

// A chunk a killed sender left in flight reaches the receiver around its successor's gap frame:
// delivered, it is not missing; given up, it is named missing; never both, never neither.
TEST(StreamTracker, AGapNeverCoversWhatWasDeliveredHere) {
  StreamTracker t;
  for (std::uint64_t q : {0, 1, 2, 4}) t.on_chunk(0, q, true, 1);
  const wire::Gap g{2, 8, wire::GapReason::sender_restarted};
  EXPECT_EQ(t.on_gaps(0, {&g, 1}), wire::DecodeError::ok);
  EXPECT_EQ(t.gaps(0), (std::vector<wire::Gap>{{3, 4, wire::GapReason::sender_restarted},
                                               {5, 8, wire::GapReason::sender_restarted}}));
  EXPECT_EQ(t.past_gaps(0, 3), 4u);
  EXPECT_EQ(t.past_gaps(0, 5), 8u);
  EXPECT_EQ(t.on_chunk(0, 6, true, 1), StreamTracker::Verdict::duplicate)
      << "declared gone: not taken late";
  t.on_end_of_stream(eos_header(0, 0, 1), {8, 8, 4});
  EXPECT_EQ(t.totals().declared_missing, 4u);
  EXPECT_EQ(t.totals().lost, 4u);
  EXPECT_EQ(t.streams_json()[0]["missing"], (nlohmann::json{"3", "5-7"}));
}

TEST(SeqSet, HoldsAWindowOfBitsAboveItsFloor) {
  SeqSet s(128);
  EXPECT_TRUE(s.insert(0));
  EXPECT_TRUE(s.insert(2));
  EXPECT_FALSE(s.insert(2));
  EXPECT_EQ(s.floor(), 1u);
  EXPECT_FALSE(s.insert(129)) << "beyond the window";
  EXPECT_TRUE(s.insert(128));
  EXPECT_EQ(s.above(), (std::vector<std::uint64_t>{2, 128}));
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.end(), 129u);
  EXPECT_EQ(s.raise_floor(100), 98u) << "1 and 3-99 were not members";
  EXPECT_EQ(s.floor(), 100u);
  EXPECT_TRUE(s.contains(128));
  EXPECT_FALSE(s.contains(101));
  EXPECT_EQ(s.raise_floor(std::uint64_t{1} << 40), (std::uint64_t{1} << 40) - 101);
  EXPECT_EQ(s.size(), std::uint64_t{1} << 40);
  EXPECT_EQ(s.bitmap_bytes(), 0u);
  // Random order, every member once: ends as a bare floor.
  SeqSet r(1 << 14);
  std::vector<std::uint64_t> order(1 << 14);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  for (auto q : order) EXPECT_TRUE(r.insert(q));
  EXPECT_EQ(r.floor(), order.size());
  EXPECT_EQ(r.bitmap_bytes(), 0u);
}

}  // namespace
}  // namespace numastream
