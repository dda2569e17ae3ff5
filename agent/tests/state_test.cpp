#include "store/state.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "temp_dir.hpp"

namespace numastream {
namespace {

TEST(StreamState, RecordsAndReadsBackTheAcknowledgedChunks) {
  std::string dir = temp_dir();
  {
    StreamState s(dir, 3, 1);
    EXPECT_FALSE(s.load().has_value()) << "no record yet";
    s.save(120, {122, 125});
  }
  StreamState s(dir, 3, 1);
  auto rec = s.load();
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->first, 120u);
  EXPECT_EQ(rec->second, (std::vector<std::uint64_t>{122, 125}));
}

TEST(StreamState, OneHolderAtATime) {
  std::string dir = temp_dir();
  auto first = std::make_unique<StreamState>(dir, 0, 1);
  try {
    StreamState second(dir, 0, 0.3);
    FAIL() << "two senders of one stream held its record";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("another sender of stream 0"), std::string::npos)
        << e.what();
  }
  StreamState other_stream(dir, 1, 0.3);  // another stream's record is another lock
  first.reset();
  StreamState second(dir, 0, 0.3);
}

TEST(StreamState, ForeignOrBrokenRecordsAreNamed) {
  std::string dir = temp_dir();
  std::ofstream(dir + "/stream-0.json") << R"({"stream": 4, "floor": 1})";
  std::ofstream(dir + "/stream-1.json") << "{ torn";
  EXPECT_THROW(StreamState(dir, 0, 1).load(), std::runtime_error);
  try {
    StreamState(dir, 1, 1).load();
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/stream-1.json"), std::string::npos) << e.what();
  }
  // Found by the state fuzzer: an acknowledged sequence that is not a number ended the sender
  // in std::terminate (an uncaught JSON type error) instead of an error naming the file.
  std::ofstream(dir + "/stream-2.json") << R"({"stream": 2, "floor": 1, "above": ["x"]})";
  try {
    StreamState(dir, 2, 1).load();
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/stream-2.json"), std::string::npos) << e.what();
  }
}

TEST(StreamState, KeepsTheDeclaredGaps) {
  std::string dir = temp_dir();
  {
    StreamState s(dir, 4, 1);
    s.save(30, {},
           {{10, 15, wire::GapReason::sender_restarted}, {20, 21, wire::GapReason::spill_full}});
  }
  StreamState s(dir, 4, 1);
  EXPECT_EQ(s.gaps(), (std::vector<wire::Gap>{{10, 15, wire::GapReason::sender_restarted},
                                              {20, 21, wire::GapReason::spill_full}}));
}

// Every reason a gap can have is read back: a record holding a chunk its gateway discarded
// (reason 4) was refused, and the sender exited 1 on every restart.
TEST(StreamState, ReadsBackAGapOfEveryReason) {
  std::string dir = temp_dir();
  std::vector<wire::Gap> gaps;
  for (std::uint64_t r = 1; r <= wire::kLastGapReason; ++r)
    gaps.push_back({r * 10, r * 10 + 3, static_cast<wire::GapReason>(r)});
  {
    StreamState s(dir, 5, 1);
    s.save(100, {}, gaps);
  }
  {
    StreamState s(dir, 5, 1);
    EXPECT_EQ(s.gaps(), gaps);
  }
  for (const auto& g : gaps) EXPECT_NE(wire::gap_reason_name(g.reason), "unknown");
  // One past the last reason is not a record this version wrote: named, not guessed.
  std::ofstream(dir + "/stream-5.json") << R"({"stream":5,"floor":100,"above":[],"gaps":[[10,13,)"
                                        << wire::kLastGapReason + 1 << "]]}";
  StreamState s(dir, 5, 1);
  try {
    s.gaps();
    ADD_FAILURE() << "a gap of reason " << wire::kLastGapReason + 1 << " was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a gap is not [first, end, reason]"), std::string::npos)
        << e.what();
  }
}

// A live source's senders count what they took; the next one learns it exactly (same boot), or
// as a bound when the count is from an earlier boot of the node.
TEST(TakenRecord, CountsWhatEarlierSendersTookExactlyWithinABoot) {
  std::string dir = temp_dir();
  {
    TakenRecord r(dir, 2);
    EXPECT_FALSE(r.earlier().has_value());
    for (std::uint64_t n = 1; n <= 1500; ++n) r.taken(n);
  }
  {
    TakenRecord r(dir, 2);
    ASSERT_TRUE(r.earlier().has_value());
    EXPECT_EQ(r.earlier()->taken, 1500u);
    EXPECT_EQ(r.earlier()->at_most, 1500u);
    EXPECT_TRUE(r.earlier()->exact);
  }
  // The same record written on another boot: what was fsynced (the reservation) bounds it.
  std::fstream f(dir + "/stream-2.taken", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(24);
  f.write("00000000-0000-0000-0000-000000000000", 36);
  f.close();
  TakenRecord r(dir, 2);
  ASSERT_TRUE(r.earlier().has_value());
  EXPECT_FALSE(r.earlier()->exact);
  EXPECT_EQ(r.earlier()->taken, 1500u);
  EXPECT_GE(r.earlier()->at_most, 1500u) << "reserved in steps, fsynced: a bound";
  EXPECT_LE(r.earlier()->at_most, 1500u + TakenRecord::kReserve);
}

TEST(TakenRecord, AFileThatIsNotARecordIsNamed) {
  std::string dir = temp_dir();
  std::ofstream(dir + "/stream-7.taken") << "hello";
  try {
    TakenRecord r(dir, 7);
    FAIL() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/stream-7.taken"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace numastream
