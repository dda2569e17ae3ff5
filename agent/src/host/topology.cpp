#include "host/topology.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "host/cpuset.hpp"

namespace fs = std::filesystem;

namespace numastream {
namespace {

// Contents of a small sysfs file, or nullopt when it is missing or unreadable (sysfs answers
// some reads, e.g. `speed` of a link that is down, with EINVAL).
std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::optional<long long> read_int(const fs::path& p) {
  auto text = read_text(p);
  if (!text || text->empty()) return std::nullopt;
  long long v = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || end != text->data() + text->size()) return std::nullopt;
  return v;
}

std::vector<int> read_cpulist_file(const fs::path& p) {
  auto text = read_text(p);
  if (!text) throw std::runtime_error("topology: cannot read " + p.string());
  try {
    return parse_cpulist(*text);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("topology: " + p.string() + ": " + e.what());
  }
}

std::optional<int> node_dir_id(const std::string& name) {
  if (name.size() < 5 || name.compare(0, 4, "node") != 0) return std::nullopt;
  int id = -1;
  auto [end, ec] = std::from_chars(name.data() + 4, name.data() + name.size(), id);
  if (ec != std::errc() || end != name.data() + name.size() || id < 0) return std::nullopt;
  return id;
}

std::uint64_t read_mem_total_kb(const fs::path& meminfo) {
  auto text = read_text(meminfo);
  if (!text) return 0;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    auto pos = line.find("MemTotal:");
    if (pos == std::string::npos) continue;
    std::istringstream fields(line.substr(pos + 9));
    std::uint64_t kb = 0;
    fields >> kb;
    return kb;
  }
  return 0;
}

// The physical core of a CPU: (package, core id) from cpu<N>/topology as one key; a CPU whose
// topology the kernel does not show is a core of its own (a negative key).
long core_key(const fs::path& root, int cpu) {
  fs::path t = root / "devices/system/cpu" / ("cpu" + std::to_string(cpu)) / "topology";
  auto core = read_int(t / "core_id");
  auto pkg = read_int(t / "physical_package_id");
  if (core && pkg && *core >= 0 && *pkg >= 0 && *core < (1L << 20)) return (*pkg << 20) | *core;
  return -1L - cpu;
}

// Physical cores among cpus: distinct core keys.
int count_cores(const std::vector<int>& cpus, std::map<int, long>& core_of) {
  std::set<long> cores;
  for (int cpu : cpus) cores.insert(core_of.at(cpu));
  return static_cast<int>(cores.size());
}

std::vector<NumaNode> read_nodes(const fs::path& root, bool& from_sysfs,
                                 std::map<int, long>& core_of) {
  std::vector<NumaNode> nodes;
  fs::path node_root = root / "devices/system/node";
  std::error_code ec;
  if (fs::is_directory(node_root, ec)) {
    for (const auto& entry : fs::directory_iterator(node_root, ec)) {
      auto id = node_dir_id(entry.path().filename().string());
      if (!id || !entry.is_directory()) continue;
      NumaNode n;
      n.id = *id;
      n.cpus = read_cpulist_file(entry.path() / "cpulist");
      if (auto d = read_text(entry.path() / "distance")) {
        std::istringstream in(*d);
        int v;
        while (in >> v) n.distances.push_back(v);
      }
      n.mem_total_kb = read_mem_total_kb(entry.path() / "meminfo");
      nodes.push_back(std::move(n));
    }
  }
  std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) { return a.id < b.id; });
  // Memory-only nodes (CXL, HBM without cores) hold no CPUs; keep them, placement skips them.
  bool any_cpu = std::any_of(nodes.begin(), nodes.end(), [](auto& n) { return !n.cpus.empty(); });
  if (any_cpu) {
    from_sysfs = true;
    for (auto& n : nodes) {
      for (int cpu : n.cpus) core_of[cpu] = core_key(root, cpu);
      n.cores = count_cores(n.cpus, core_of);
    }
    return nodes;
  }
  // No NUMA information (kernel without CONFIG_NUMA, some containers): one node with every CPU.
  from_sysfs = false;
  NumaNode only;
  only.id = 0;
  only.cpus = read_cpulist_file(root / "devices/system/cpu/online");
  if (only.cpus.empty()) {
    throw std::runtime_error("topology: no CPUs found under " + root.string());
  }
  for (int cpu : only.cpus) core_of[cpu] = core_key(root, cpu);
  only.cores = count_cores(only.cpus, core_of);
  return {only};
}

std::string pci_address_of(const fs::path& device) {
  if (auto uevent = read_text(device / "uevent")) {
    std::istringstream in(*uevent);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("PCI_SLOT_NAME=", 0) == 0) return line.substr(14);
    }
  }
  std::error_code ec;
  if (fs::is_symlink(device, ec)) {
    auto target = fs::read_symlink(device, ec).filename().string();
    // PCI addresses look like 0000:3b:00.0
    if (target.size() == 12 && target[4] == ':' && target[7] == ':' && target[10] == '.') {
      return target;
    }
  }
  return "";
}

std::vector<Nic> read_nics(const fs::path& root) {
  std::vector<Nic> nics;
  fs::path net = root / "class/net";
  std::error_code ec;
  if (!fs::is_directory(net, ec)) return nics;
  for (const auto& entry : fs::directory_iterator(net, ec)) {
    Nic nic;
    nic.name = entry.path().filename().string();
    if (nic.name == "lo") continue;
    fs::path dev = entry.path() / "device";
    nic.is_virtual = !fs::exists(dev, ec);
    if (!nic.is_virtual) {
      nic.numa_node = static_cast<int>(read_int(dev / "numa_node").value_or(-1));
      if (nic.numa_node < -1) nic.numa_node = -1;
      nic.pci_address = pci_address_of(dev);
    }
    auto speed = read_int(entry.path() / "speed");
    nic.speed_mbps = speed && *speed > 0 ? *speed : -1;
    nic.operstate = read_text(entry.path() / "operstate").value_or("unknown");
    nics.push_back(std::move(nic));
  }
  std::sort(nics.begin(), nics.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return nics;
}

}  // namespace

long Topology::core(int cpu) const noexcept {
  auto it = core_of.find(cpu);
  return it == core_of.end() ? -1L - cpu : it->second;
}

int Topology::node_of_cpu(int cpu) const noexcept {
  for (const auto& n : nodes) {
    if (std::binary_search(n.cpus.begin(), n.cpus.end(), cpu)) return n.id;
  }
  return -1;
}

const Nic* Topology::find_nic(std::string_view name) const noexcept {
  for (const auto& n : nics) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

const NumaNode* Topology::find_node(int id) const noexcept {
  for (const auto& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

Topology read_topology(const fs::path& sysfs_root) {
  std::error_code ec;
  if (!fs::is_directory(sysfs_root, ec)) {
    throw std::runtime_error("topology: sysfs root " + sysfs_root.string() + " is not a directory");
  }
  Topology t;
  t.nodes = read_nodes(sysfs_root, t.numa_from_sysfs, t.core_of);
  t.nics = read_nics(sysfs_root);
  return t;
}

nlohmann::json topology_to_json(const Topology& topo, const std::vector<int>& allowed) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : topo.nodes) {
    std::vector<int> usable;
    std::set_intersection(n.cpus.begin(), n.cpus.end(), allowed.begin(), allowed.end(),
                          std::back_inserter(usable));
    nodes.push_back({{"id", n.id},
                     {"cpus", format_cpulist(n.cpus)},
                     {"cpu_count", n.cpus.size()},
                     {"core_count", n.cores},
                     {"allowed_cpus", format_cpulist(usable)},
                     {"distances", n.distances},
                     {"mem_total_kb", n.mem_total_kb}});
  }
  nlohmann::json nics = nlohmann::json::array();
  for (const auto& n : topo.nics) {
    nics.push_back({{"name", n.name},
                    {"numa_node", n.numa_node},
                    {"pci_address", n.pci_address},
                    {"speed_mbps", n.speed_mbps},
                    {"operstate", n.operstate},
                    {"virtual", n.is_virtual}});
  }
  return {{"numa_nodes", nodes},
          {"numa_from_sysfs", topo.numa_from_sysfs},
          {"allowed_cpus", format_cpulist(allowed)},
          {"nics", nics}};
}

}  // namespace numastream
