#include "host/placement.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <stdexcept>

#include "host/cpuset.hpp"

namespace numastream {

NumaTarget NumaTarget::parse(std::string_view text) {
  if (text == "any") return {Kind::any, -1};
  if (text == "spread") return {Kind::spread, -1};
  if (text == "nic") return {Kind::nic, -1};
  int node = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), node);
  if (ec == std::errc() && end == text.data() + text.size() && node >= 0 && node < 4096) {
    return {Kind::node, node};
  }
  throw std::invalid_argument(
      "'" + std::string(text) +
      "' is not a NUMA target (use a node id, \"nic\", \"spread\" or \"any\")");
}

std::string NumaTarget::to_string() const {
  switch (kind) {
    case Kind::any:
      return "any";
    case Kind::spread:
      return "spread";
    case Kind::nic:
      return "nic";
    case Kind::node:
      return std::to_string(node);
  }
  return "any";
}

std::vector<ThreadSlot> Placement::stage(Stage name) const {
  std::vector<ThreadSlot> out;
  for (const auto& t : threads) {
    if (t.stage == name) out.push_back(t);
  }
  return out;
}

std::vector<int> Placement::stage_cpus(Stage name) const {
  std::vector<int> cpus;
  for (const auto& t : threads) {
    if (t.stage == name && t.cpu >= 0) cpus.push_back(t.cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::optional<bool> Placement::nic_local(Stage name) const {
  if (!nic_node) return std::nullopt;
  bool any = false;
  for (const auto& t : threads) {
    if (t.stage != name) continue;
    if (t.numa_node < 0) return std::nullopt;
    if (t.numa_node != *nic_node) return false;
    any = true;
  }
  if (!any) return std::nullopt;
  return true;
}

namespace {

int priority(NumaTarget::Kind k) {
  switch (k) {
    case NumaTarget::Kind::node:
    case NumaTarget::Kind::nic:
      return 0;
    case NumaTarget::Kind::spread:
      return 1;
    case NumaTarget::Kind::any:
      return 2;
  }
  return 2;
}

class CpuLedger {
 public:
  explicit CpuLedger(const Topology& topo) : topo_(topo) {}
  int uses(int cpu) const {
    auto it = uses_.find(cpu);
    return it == uses_.end() ? 0 : it->second;
  }
  int core_uses(int cpu) const {
    auto it = core_uses_.find(topo_.core(cpu));
    return it == core_uses_.end() ? 0 : it->second;
  }
  // Least-used CPU of `cpus`; among those, one whose physical core is least used (a thread
  // gets a core of its own before it shares one with a hardware-thread sibling); lowest id on
  // ties. `cpus` is non-empty.
  int least_used(const std::vector<int>& cpus) const {
    int best = cpus.front();
    for (int c : cpus) {
      if (uses(c) < uses(best) || (uses(c) == uses(best) && core_uses(c) < core_uses(best)))
        best = c;
    }
    return best;
  }
  bool has_free(const std::vector<int>& cpus) const {
    return std::any_of(cpus.begin(), cpus.end(), [&](int c) { return uses(c) == 0; });
  }
  void take(int cpu) {
    ++uses_[cpu];
    ++core_uses_[topo_.core(cpu)];
  }

 private:
  const Topology& topo_;
  std::map<int, int> uses_;
  std::map<long, int> core_uses_;
};

// The allowed CPUs by NUMA node, the nodes that have any, and all of them.
struct Usable {
  std::vector<int> allowed;                 // sorted
  std::map<int, std::vector<int>> by_node;  // node -> allowed CPUs on it
  std::vector<int> nodes;                   // nodes with an allowed CPU
  std::vector<int> all;                     // every allowed CPU on a node, sorted
};

Usable usable_cpus(const Topology& topo, const std::vector<int>& allowed) {
  Usable u;
  u.allowed = allowed;
  std::sort(u.allowed.begin(), u.allowed.end());
  for (const auto& n : topo.nodes) {
    std::vector<int> cpus;
    std::set_intersection(n.cpus.begin(), n.cpus.end(), u.allowed.begin(), u.allowed.end(),
                          std::back_inserter(cpus));
    if (!cpus.empty()) u.nodes.push_back(n.id);
    u.all.insert(u.all.end(), cpus.begin(), cpus.end());
    u.by_node[n.id] = std::move(cpus);
  }
  std::sort(u.all.begin(), u.all.end());
  if (u.all.empty()) {
    throw std::invalid_argument("placement: none of the allowed CPUs (" +
                                format_cpulist(u.allowed) + ") belongs to a NUMA node");
  }
  return u;
}

// Where a request's threads go: `nic` as the NIC's node, a node that cannot be used as any (each
// with a warning). `requested` gets the node asked for (-1: none).
NumaTarget resolve_target(const StageRequest& req, const Topology& topo, Usable& u,
                          std::optional<int> nic_node, int& requested,
                          std::vector<std::string>& warnings) {
  NumaTarget target = req.target;
  requested = -1;
  if (target.kind == NumaTarget::Kind::nic) {
    if (!nic_node) {
      warnings.push_back("stage '" + req.stage +
                         "': target 'nic' but the NIC's NUMA node is unknown; placed on any node");
      return {NumaTarget::Kind::any, -1};
    }
    target = {NumaTarget::Kind::node, *nic_node};
  }
  if (target.kind != NumaTarget::Kind::node) return target;
  requested = target.node;
  if (!topo.find_node(target.node)) {
    warnings.push_back("stage '" + req.stage + "': NUMA node " + std::to_string(target.node) +
                       " does not exist on this machine; placed on any node");
    return {NumaTarget::Kind::any, -1};
  }
  if (u.by_node[target.node].empty()) {
    warnings.push_back("stage '" + req.stage + "': NUMA node " + std::to_string(target.node) +
                       " has none of the allowed CPUs (" + format_cpulist(u.allowed) +
                       "); placed on any node");
    return {NumaTarget::Kind::any, -1};
  }
  return target;
}

// The CPUs thread `i` of a request for `target` may take: its node's, a node in turn (spread,
// the next with a free CPU), or any.
const std::vector<int>& pool_for(const NumaTarget& target, int i, Usable& u,
                                 const CpuLedger& ledger) {
  if (target.kind == NumaTarget::Kind::node) return u.by_node[target.node];
  if (target.kind != NumaTarget::Kind::spread) return u.all;
  const std::size_t n = u.nodes.size();
  int chosen = u.nodes[static_cast<std::size_t>(i) % n];
  for (std::size_t k = 0; k < n; ++k) {
    const int node = u.nodes[(static_cast<std::size_t>(i) + k) % n];
    if (ledger.has_free(u.by_node[node])) {
      chosen = node;
      break;
    }
  }
  return u.by_node[chosen];
}

// Marks the threads that share a CPU, and warns naming their stages.
void mark_shared(Placement& result, std::size_t usable_cpus) {
  std::map<int, int> count;
  for (const auto& t : result.threads) ++count[t.cpu];
  std::vector<Stage> sharing;
  for (auto& t : result.threads) {
    t.shared_cpu = count[t.cpu] > 1;
    if (t.shared_cpu && std::find(sharing.begin(), sharing.end(), t.stage) == sharing.end()) {
      sharing.push_back(t.stage);
    }
  }
  if (sharing.empty()) return;
  std::string stages;
  for (Stage s : sharing) stages += (stages.empty() ? "" : ", ") + s;
  result.warnings.push_back(std::to_string(result.threads.size()) + " threads on " +
                            std::to_string(usable_cpus) + " allowed CPUs: threads of " + stages +
                            " share CPUs");
}

}  // namespace

Placement place(const Topology& topo, const std::vector<int>& allowed, std::optional<int> nic_node,
                const std::vector<StageRequest>& requests) {
  Usable u = usable_cpus(topo, allowed);
  Placement result;
  result.nic_node = nic_node;
  std::vector<std::size_t> order(requests.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return priority(requests[a].target.kind) < priority(requests[b].target.kind);
  });

  CpuLedger ledger(topo);
  std::vector<std::vector<ThreadSlot>> per_request(requests.size());
  for (std::size_t r : order) {
    const StageRequest& req = requests[r];
    int requested = -1;
    const NumaTarget target = resolve_target(req, topo, u, nic_node, requested, result.warnings);
    for (int i = 0; i < req.threads; ++i) {
      const int cpu = ledger.least_used(pool_for(target, i, u, ledger));
      ThreadSlot slot;
      slot.stage = req.stage;
      slot.index = i;
      slot.cpu = cpu;
      slot.numa_node = topo.node_of_cpu(cpu);
      slot.requested_node = requested;
      ledger.take(cpu);
      per_request[r].push_back(slot);
    }
  }
  for (auto& slots : per_request) {
    for (const auto& s : slots) result.threads.push_back(s);
  }
  mark_shared(result, u.all.size());
  return result;
}

Placement place_os(const std::vector<StageRequest>& requests, std::optional<int> nic_node) {
  Placement result;
  result.nic_node = nic_node;
  for (const auto& req : requests) {
    for (int i = 0; i < req.threads; ++i) {
      ThreadSlot slot;
      slot.stage = req.stage;
      slot.index = i;
      result.threads.push_back(slot);
    }
  }
  return result;
}

}  // namespace numastream
