// CPU lists in the kernel's "0-3,8,10-11" notation.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace numastream {

// Parses a kernel cpulist. Returns sorted, unique CPU ids. Throws std::invalid_argument naming
// the bad token on malformed input. An empty (or whitespace-only) string is an empty list.
std::vector<int> parse_cpulist(std::string_view text);

// Formats sorted CPU ids back into ranges: {0,1,2,5} -> "0-2,5".
std::string format_cpulist(const std::vector<int>& cpus);

// The CPUs this process may run on (sched_getaffinity): inside a Kubernetes container, the
// cpuset the kubelet gave it.
std::vector<int> allowed_cpus();

}  // namespace numastream
