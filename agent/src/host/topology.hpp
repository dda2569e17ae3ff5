// The machine's NUMA layout and NICs, read from sysfs under an injectable root so tests run
// against fixture trees shaped like /sys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace numastream {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // from node<N>/cpulist
  int cores = 0;          // physical cores among cpus (hardware threads of one core count once)
  std::vector<int>
      distances;  // SLIT row from node<N>/distance, indexed by node order; may be empty
  std::uint64_t mem_total_kb = 0;
};

struct Nic {
  std::string name;
  int numa_node = -1;            // -1: the kernel does not know (single-node machines, some VMs)
  std::string pci_address;       // empty for virtual interfaces
  std::int64_t speed_mbps = -1;  // -1: unknown (link down or virtual)
  std::string operstate;
  bool is_virtual = true;  // no backing device (veth, bridge, macvlan, ...)
};

struct Topology {
  std::vector<NumaNode> nodes;  // sorted by id; never empty
  std::vector<Nic> nics;        // sorted by name; loopback excluded
  bool numa_from_sysfs = true;  // false: no node directories, one synthetic node holds all CPUs
  // The physical core of each CPU (hardware threads of one core share a key; a CPU whose
  // topology the kernel does not show is a core of its own). Absent CPUs: cores of their own.
  std::map<int, long> core_of;

  // The physical core of `cpu` (its own id, negated and shifted, when unknown).
  long core(int cpu) const noexcept;
  // The node that holds `cpu`, or -1.
  int node_of_cpu(int cpu) const noexcept;
  const Nic* find_nic(std::string_view name) const noexcept;
  const NumaNode* find_node(int id) const noexcept;
};

// Reads topology from `sysfs_root` (normally "/sys"). Throws std::runtime_error naming the file
// when the tree is unusable (no CPUs at all, unparsable cpulist).
Topology read_topology(const std::filesystem::path& sysfs_root);

// The JSON the `topology` subcommand prints and the node daemon publishes.
nlohmann::json topology_to_json(const Topology& topo, const std::vector<int>& allowed);

}  // namespace numastream
