// The CPU budget of this process as its cgroup (v2) sets it: the CPUs it may use (cpuset) and
// the CPU time it may take (cpu.max quota). Kubernetes changes both under a running container when
// a pod is resized in place; the adaptive runtime reads them every window and says when they
// changed (pipeline/governor.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace numastream {

struct CpuBudget {
  std::vector<int> cpus;  // cpuset.cpus.effective (the affinity of the process when absent)
  double quota = 0;       // cpu.max as CPUs (1.5 = 150000/100000); 0 = no quota
  bool operator==(const CpuBudget&) const = default;
  std::string to_string() const;
  // The CPUs' worth of threads that can run at once: the cpuset's size, capped by the quota
  // (rounded up); at least 1.
  int capacity() const;  // "CPUs 2-5, quota 1.5" / "CPUs 2-5, no quota"
};

// "max 100000" -> 0 (no quota); "150000 100000" -> 1.5. Throws std::invalid_argument naming the
// text when it is neither.
double parse_cpu_max(std::string_view text);

// Reads the budget under `cgroup_root` (inside a container, /sys/fs/cgroup is its own cgroup):
// cgroup v2's cpuset.cpus.effective and cpu.max, else v1's cpuset/cpuset.effective_cpus and
// cpu/cpu.cfs_quota_us over cpu.cfs_period_us (-1: no quota).
CpuBudget read_budget(const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace numastream
