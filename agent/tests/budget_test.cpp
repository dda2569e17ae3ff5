#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "host/budget.hpp"

namespace numastream {
namespace {

TEST(CpuBudget, CpuMaxReadsAsCpus) {
  EXPECT_EQ(parse_cpu_max("max 100000\n"), 0);
  EXPECT_EQ(parse_cpu_max("150000 100000"), 1.5);
  EXPECT_EQ(parse_cpu_max("400000 100000"), 4);
  for (const char* bad : {"", "max", "abc 100000", "-5 100000", "100000 0"}) {
    try {
      parse_cpu_max(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("cpu.max"), std::string::npos) << e.what();
    }
  }
}

// A cgroup as a resized container sees it: the cpuset grows, the quota with it.
TEST(CpuBudget, ReadFromTheCgroupAndComparedAcrossAResize) {
  const auto dir = std::filesystem::temp_directory_path() / ("budget-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "cpuset.cpus.effective") << "2-3\n";
  std::ofstream(dir / "cpu.max") << "200000 100000\n";
  const CpuBudget before = read_budget(dir.string());
  EXPECT_EQ(before.cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(before.quota, 2);
  EXPECT_EQ(before.to_string(), "CPUs 2-3, quota 2.00 CPUs");
  std::ofstream(dir / "cpuset.cpus.effective") << "2-5\n";
  std::ofstream(dir / "cpu.max") << "max 100000\n";
  const CpuBudget after = read_budget(dir.string());
  EXPECT_FALSE(after == before);
  EXPECT_EQ(after.to_string(), "CPUs 2-5, no quota");
  std::filesystem::remove_all(dir);
  // Without a cgroup file: the process's affinity.
  EXPECT_FALSE(read_budget("/nonexistent").cpus.empty());
}

}  // namespace
}  // namespace numastream
