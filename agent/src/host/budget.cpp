#include "host/budget.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "host/cpuset.hpp"

namespace numastream {

std::string CpuBudget::to_string() const {
  std::string out = "CPUs " + format_cpulist(cpus);
  if (quota <= 0) return out + ", no quota";
  char buf[32];
  std::snprintf(buf, sizeof(buf), ", quota %.2f CPUs", quota);
  return out + buf;
}

int CpuBudget::capacity() const {
  int n = static_cast<int>(cpus.size());
  if (quota > 0) n = std::min(n, static_cast<int>(std::ceil(quota - 1e-6)));
  return std::max(n, 1);
}

double parse_cpu_max(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string quota, period;
  if (!(in >> quota >> period))
    throw std::invalid_argument("cpu.max: \"" + std::string(text) + "\" is not \"QUOTA PERIOD\"");
  try {
    const double p = std::stod(period);
    if (p <= 0) throw std::invalid_argument("period");
    if (quota == "max") return 0;
    const double q = std::stod(quota);
    if (q <= 0) throw std::invalid_argument("quota");
    return q / p;
  } catch (const std::exception&) {
    throw std::invalid_argument("cpu.max: \"" + std::string(text) + "\" is not \"QUOTA PERIOD\"");
  }
}

namespace {

bool read_line(const std::string& path, std::string& out) {
  std::ifstream in(path);
  return static_cast<bool>(std::getline(in, out));
}

}  // namespace

CpuBudget read_budget(const std::string& cgroup_root) {
  CpuBudget b;
  std::string line;
  // cgroup v2 (one hierarchy), else v1 (a hierarchy per controller, as a container on a v1 host
  // sees them: /sys/fs/cgroup/cpuset, /sys/fs/cgroup/cpu).
  if ((read_line(cgroup_root + "/cpuset.cpus.effective", line) ||
       read_line(cgroup_root + "/cpuset/cpuset.effective_cpus", line) ||
       read_line(cgroup_root + "/cpuset/cpuset.cpus", line)) &&
      !line.empty()) {
    b.cpus = parse_cpulist(line);
  } else {
    b.cpus = allowed_cpus();
  }
  if (read_line(cgroup_root + "/cpu.max", line)) {
    b.quota = parse_cpu_max(line);
    return b;
  }
  for (const char* dir : {"/cpu", "/cpu,cpuacct"}) {
    std::string quota, period;
    if (read_line(cgroup_root + dir + "/cpu.cfs_quota_us", quota) &&
        read_line(cgroup_root + dir + "/cpu.cfs_period_us", period)) {
      // -1: no quota
      b.quota = quota.rfind('-', 0) == 0 ? 0 : parse_cpu_max(quota + " " + period);
      break;
    }
  }
  return b;
}

}  // namespace numastream
