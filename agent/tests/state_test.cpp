#include "store/state.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

namespace numastream {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/numastream-state-XXXXXX";
  return mkdtemp(tmpl);
}

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
    EXPECT_NE(std::string(e.what()).find("another sender of stream 0"), std::string::npos) << e.what();
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
}

}  // namespace
}  // namespace numastream
