#include "host/cpuset.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace numastream {
namespace {

TEST(Cpulist, ParsesRangesAndSingles) {
  EXPECT_EQ(parse_cpulist("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist("5"), (std::vector<int>{5}));
  EXPECT_TRUE(parse_cpulist("").empty());
  EXPECT_TRUE(parse_cpulist("\n").empty());
}

TEST(Cpulist, SortsAndDeduplicates) {
  EXPECT_EQ(parse_cpulist("3,1-2,2"), (std::vector<int>{1, 2, 3}));
}

TEST(Cpulist, RejectsMalformedInputNamingTheToken) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1.5", "0-99999"}) {
    try {
      parse_cpulist(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(Cpulist, FormatsRanges) {
  EXPECT_EQ(format_cpulist({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_EQ(format_cpulist({}), "");
  EXPECT_EQ(format_cpulist(parse_cpulist("0-31")), "0-31");
}

TEST(Cpulist, AllowedCpusIsNonEmpty) { EXPECT_FALSE(allowed_cpus().empty()); }

}  // namespace
}  // namespace numastream
