#include "host/budget.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
  const auto dir =
      std::filesystem::temp_directory_path() / ("budget-" + std::to_string(::getpid()));
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
  EXPECT_EQ(after.capacity(), 4);
  EXPECT_EQ(before.capacity(), 2);
  std::filesystem::remove(dir / "cpuset.cpus.effective");
  std::filesystem::remove(dir / "cpu.max");
  // cgroup v1, as a container on a v1 host sees it (the facility's kubelets): a hierarchy per
  // controller.
  std::filesystem::create_directories(dir / "cpu");
  std::filesystem::create_directories(dir / "cpuset");
  std::ofstream(dir / "cpuset" / "cpuset.effective_cpus") << "0-1\n";
  std::ofstream(dir / "cpu" / "cpu.cfs_quota_us") << "150000\n";
  std::ofstream(dir / "cpu" / "cpu.cfs_period_us") << "100000\n";
  const CpuBudget v1 = read_budget(dir.string());
  EXPECT_EQ(v1.to_string(), "CPUs 0-1, quota 1.50 CPUs");
  EXPECT_EQ(v1.capacity(), 2);
  std::ofstream(dir / "cpu" / "cpu.cfs_quota_us") << "-1\n";
  EXPECT_EQ(read_budget(dir.string()).to_string(), "CPUs 0-1, no quota");
  std::filesystem::remove_all(dir);
  // Without a cgroup file: the process's affinity.
  EXPECT_FALSE(read_budget("/nonexistent").cpus.empty());
}

}  // namespace
}  // namespace numastream
