# A sysfs view in which this machine's CPUs 0 and 1 sit on two NUMA nodes: sourced by
# hack/real-node.sh and hack/facility.sh, whose kubelets (in mount namespaces of their own), node
# daemons and agents read it where they would read /sys/devices/system/{cpu,node}.
#
#   numa_view_system DIR   writes DIR/cpu and DIR/node: CPU 0 on node 0, CPU 1 on node 1 (the
#                          machine's own CPU ids, so the cpusets a static CPU manager writes are
#                          real), per-CPU topology (one core each, one package per node),
#                          distances 10/20, the memory split in halves (memory stays one real
#                          node: nothing can bind it), hugepage counts zero.
#   nic_view DIR NUMA      writes DIR/device/numa_node, DIR/speed and DIR/operstate: what the
#                          agent's topology reads of a NIC under class/net/<nic>.

numa_view_system() { # dir
  local v=$1 c total half
  rm -rf "$v/cpu" "$v/node"
  mkdir -p "$v/cpu" "$v/node"
  for f in online possible present; do echo "0-1" >"$v/cpu/$f"; done
  total=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  half=$((total / 2))
  for c in 0 1; do
    mkdir -p "$v/cpu/cpu$c/topology" "$v/node/node$c"
    echo "$c" >"$v/cpu/cpu$c/topology/core_id"
    echo "$c" >"$v/cpu/cpu$c/topology/physical_package_id"
    echo 0 >"$v/cpu/cpu$c/topology/die_id"
    echo "$c" >"$v/cpu/cpu$c/topology/thread_siblings_list"
    echo "$c" >"$v/cpu/cpu$c/topology/core_siblings_list"
    ((c == 0)) || echo 1 >"$v/cpu/cpu$c/online"
    ln -s "../../cpu/cpu$c" "$v/node/node$c/cpu$c"
    echo "$c" >"$v/node/node$c/cpulist"
    printf '%x\n' $((1 << c)) >"$v/node/node$c/cpumap"
    if ((c == 0)); then echo "10 20" >"$v/node/node$c/distance"; else echo "20 10" >"$v/node/node$c/distance"; fi
    printf 'Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\nNode %d MemUsed:        0 kB\n' \
      "$c" "$half" "$c" "$half" "$c" >"$v/node/node$c/meminfo"
    for h in /sys/devices/system/node/node0/hugepages/*/; do
      [[ -d "$h" ]] || continue
      mkdir -p "$v/node/node$c/hugepages/$(basename "$h")"
      for f in free_hugepages nr_hugepages surplus_hugepages; do
        echo 0 >"$v/node/node$c/hugepages/$(basename "$h")/$f"
      done
    done
  done
  for f in online possible has_cpu has_memory has_normal_memory; do echo "0-1" >"$v/node/$f"; done
}

nic_view() { # dir numa-node
  mkdir -p "$1/device"
  echo "$2" >"$1/device/numa_node"
  echo 100000 >"$1/speed"
  echo up >"$1/operstate"
}
