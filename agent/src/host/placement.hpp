// Placement: a pure function from (topology, the CPUs this process may use, the per-stage plan)
// to one CPU and one memory node per stage thread. Threads pin themselves after they start;
// nothing here touches the running process.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/stage.hpp"
#include "host/topology.hpp"

namespace numastream {

// Where a stage's threads should run.
struct NumaTarget {
  enum class Kind { any, node, nic, spread };
  Kind kind = Kind::any;
  int node = -1;  // only for Kind::node

  // "any", "spread", "nic" or a node id ("0", "1", ...). Throws std::invalid_argument.
  static NumaTarget parse(std::string_view text);
  std::string to_string() const;
  bool operator==(const NumaTarget&) const = default;
};

struct StageRequest {
  Stage stage = Stage::source;
  int threads = 1;
  NumaTarget target;
};

struct ThreadSlot {
  Stage stage = Stage::source;
  int index = 0;            // thread number within the stage
  int cpu = -1;             // -1: not pinned (placement mode "os")
  int numa_node = -1;       // memory node for this thread's buffers; -1: no preference
  int requested_node = -1;  // the node the target asked for, -1 when the target named none
  bool shared_cpu = false;  // another thread of this process was given the same CPU
};

struct Placement {
  std::vector<ThreadSlot> threads;    // in request order, stage by stage
  std::vector<std::string> warnings;  // every place where the plan could not be honoured
  std::optional<int> nic_node;        // NUMA node of the data NIC, when known

  // Threads of one stage, in index order.
  std::vector<ThreadSlot> stage(Stage name) const;
  // The distinct CPUs used by a stage, sorted.
  std::vector<int> stage_cpus(Stage name) const;
  // True when every thread of `stage` runs on the NIC's node; nullopt when the NIC node is unknown
  // or the stage is unpinned.
  std::optional<bool> nic_local(Stage stage) const;
};

// Maps `requests` onto `allowed` CPUs. Rules:
//  - CPUs outside `allowed` are never used; a node with no allowed CPU is skipped.
//  - Stages with a fixed node (a node id or `nic`) are placed first, then `spread`, then `any`,
//    so that flexible stages do not take the cores a NIC-local stage needs.
//  - Each thread takes the least-used CPU of its target (lowest id on ties): threads get
//    exclusive CPUs while there are enough, and share round-robin once there are not (a warning).
//  - `spread` deals threads round-robin over nodes, preferring nodes that still have a free CPU.
//  - A target that cannot be honoured (unknown NIC node, node without allowed CPUs) falls back to
//    `any` and says so in `warnings`.
// Throws std::invalid_argument when `allowed` contains no CPU of the topology.
Placement place(const Topology& topo, const std::vector<int>& allowed, std::optional<int> nic_node,
                const std::vector<StageRequest>& requests);

// The baseline: every thread unpinned (cpu = numa_node = -1), the kernel decides.
Placement place_os(const std::vector<StageRequest>& requests, std::optional<int> nic_node);

}  // namespace numastream
