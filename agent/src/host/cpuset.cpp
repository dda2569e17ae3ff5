#include "host/cpuset.hpp"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include "base/error.hpp"

namespace numastream {
namespace {

int parse_cpu(std::string_view token, std::string_view whole) {
  int value = -1;
  auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || end != token.data() + token.size() || value < 0 || value > 65535) {
    throw std::invalid_argument("bad cpulist '" + std::string(whole) + "': '" + std::string(token) +
                                "' is not a CPU number");
  }
  return value;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<int> parse_cpulist(std::string_view text) {
  std::vector<int> cpus;
  std::string_view rest = trim(text);
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty())
      throw std::invalid_argument("bad cpulist '" + std::string(text) + "': empty item");
    auto dash = item.find('-');
    if (dash == std::string_view::npos) {
      cpus.push_back(parse_cpu(item, text));
      continue;
    }
    int lo = parse_cpu(item.substr(0, dash), text);
    int hi = parse_cpu(item.substr(dash + 1), text);
    if (hi < lo) {
      throw std::invalid_argument("bad cpulist '" + std::string(text) + "': range '" +
                                  std::string(item) + "' runs backwards");
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpulist(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) throw_errno("sched_getaffinity");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace numastream
