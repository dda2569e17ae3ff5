#!/usr/bin/env bash
# The facility in a box: three REAL Kubernetes nodes beside the simulated ones, joined by a shaped
# data link, with NFD and Multus for real.
#
#   detector-a, detector-b, gateway-a and gw-numa: each a real kubelet (built from the module
#     proxy) with Debian's containerd + runc, in its own network namespace, its own mount namespace
#     (own /var/lib/kubelet, device-plugin directory, CNI state, pod logs) and its own cgroup root.
#     detector-a, detector-b, gateway-a: cpuManagerPolicy none, nothing reserved: this 2-CPU
#     machine gives each node 2 CPUs, and gateway-a a view of 4 (CPU_VIEW, sysfs_view) so two
#     streams' gateway pods fit there.
#     gw-numa: TWO NUMA nodes (NUMA_VIEW): its kubelet, its node daemon and every container
#     it runs (containerd's runc is hack/runc-numa-view) see the machine's CPU 0 on node 0 and
#     CPU 1 on node 1 (hack/lib/numa-view.sh), its data NIC fab0 on node 1 and a second NIC fab1
#     (a veth, not on the link) on node 0; the static CPU manager (kubeReserved 100m reserves
#     CPU 0, 1.9 allocatable) and Topology Manager (restricted, container scope) place its pods.
#   management network: bridge nsfac0 on the host (10.212.0.1); nodes 10.212.0.11, .12 and .13;
#     the API server listens there; each node's pods (10.244.11-13.0/24; CNI bridge + host-local)
#     are routed between the nodes and to the host.
#   facility link: each node's `fab0` (10.215.0.1 detector-a, .2 gateway-a, .3 detector-b), a veth
#     into one bridge (its own network namespace, nsfac-link), rate-limited with tc tbf at each
#     node's end (LINK_RATE, default 1gbit) with optional random loss (LINK_LOSS percent, nftables).
#   Multus (thin plugin) is each node's CNI, the bridge network its default; the
#     NetworkAttachmentDefinitions data-detector and data-gateway put pods on the link (macvlan
#     on fab0, host-local IPAM, one address range per side, its leases shared by the nodes).
#   nfd-master (built from the module proxy) turns NodeFeature objects into node labels.
#   NetworkPolicy is enforced on the pod network by kube-network-policies (built from the module
#   proxy, a DaemonSet on every node): its nfqueue handler decides each new connection. This
#   kernel lacks nftables' `queue` expression, so the rule that hands new pod connections to its
#   queue is an iptables NFQUEUE rule each node sets up (`netpol_divert`), in place of the
#   nftables table it would write itself (which the kernel refuses). The data network is closed
#   to other namespaces by Multus (namespaceIsolation): a pod attaches only to the
#   NetworkAttachmentDefinitions of its own namespace, which the admin makes (default, tenant-a).
#
#   With RELEASE_DIR (make release's output), the box installs as a facility does from a release:
#     a private registry on the host (Debian's distribution registry at 10.212.0.1:5000, TLS with
#     the box's own CA, htpasswd) holds the release's images, pushed from its OCI archives as they
#     are; each node's containerd trusts that CA and pulls with the pull secret the chart names;
#     the chart is the release's package (images pinned by digest). Without it, the images built
#     from the tree are imported into each node's containerd and the chart is charts/numastream.
#
#   facility.sh up | install | upgrade-agent TAG | operator-replicas N | down | check | clean | link-bytes | exec NODE CMD...
#
# `up` needs the simulated control plane started with API_BIND=0.0.0.0 and
# API_ADVERTISE=10.212.0.1 (make test-e2e-real and make demo do that) and leaves the cluster
# ready for `helm install`; `down` removes every process, mount, cgroup, link and namespace it
# made, and `check` fails if any is left.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib/numa-view.sh
FAC="${FACILITY_DIR:-/tmp/numastream-facility}"
SIM_DIR="${SIM_DIR:-/tmp/numastream-sim}"
KUBELET="${KUBELET_BIN:-$HOME/.cache/numastream/k8s-1.36.4-node}/kubelet"
KUBECTL="${SIM_BIN:-$HOME/.cache/numastream/k8s-1.36.4-sim}/kubectl"
FAC_BIN="${FACILITY_BIN:-$HOME/.cache/numastream/facility-nfd0.17.3-multus4.2.2}"
LINK_RATE="${LINK_RATE:-1gbit}"
LINK_LOSS="${LINK_LOSS:-0}"
API_PORT="${API_PORT:-26443}"
export KUBECONFIG="$SIM_DIR/admin.kubeconfig"
# Node names stay within 11 characters: the links fab-<node> and m-<node> must fit IFNAMSIZ (15).
NODES=(detector-a gateway-a detector-b gw-numa)
HOST_IP=10.212.0.1
declare -A MGMT_IP=([detector-a]=10.212.0.11 [gateway-a]=10.212.0.12 [detector-b]=10.212.0.13 [gw-numa]=10.212.0.14)
declare -A POD_NET=([detector-a]=10.244.11 [gateway-a]=10.244.12 [detector-b]=10.244.13 [gw-numa]=10.244.14)
declare -A LINK_IP=([detector-a]=10.215.0.1 [gateway-a]=10.215.0.2 [detector-b]=10.215.0.3 [gw-numa]=10.215.0.4)
# CPUs a node's kubelet and node daemon see, where not the machine's: gateway-a takes two
# streams, each gateway pod 2 CPUs (receive + decompress), so it is shown 4 (sysfs_view).
declare -A CPU_VIEW=([gateway-a]=4)
# Nodes whose kubelet sees two NUMA nodes, and their data NICs' NUMA nodes (NIC:node). A NIC other
# than fab0 is a veth of the node's own (the facility link is fab0).
declare -A NUMA_VIEW=([gw-numa]="fab0:1 fab1:0")
LINK_NS=nsfac-link
BRIDGE=nsfac0
# The namespaces on the data network (each gets the attachments; Multus isolates the others).
DATA_NAMESPACES="${DATA_NAMESPACES:-default tenant-a}"
KNP_VERSION=v0.8.0
KNP_IMAGE=local.numastream/kube-network-policies:$KNP_VERSION
AGENT_IMAGE="${AGENT_IMAGE:-numastream/agent:facility}"
OPERATOR_IMAGE="${OPERATOR_IMAGE:-numastream/operator:facility}"
REGISTRY=$HOST_IP:5000
PULL_SECRET=numastream-registry
k() { "$KUBECTL" "$@"; }
log() { echo "[$(date +%H:%M:%S.%3N)] $*"; }
ns() { echo "nsfac-$1"; }

why_not() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root (network and mount namespaces, containerd, kubelets)"; return; }
  [[ -d /sys/fs/cgroup/cpuset || -f /sys/fs/cgroup/cgroup.controllers ]] || { echo "no cpuset cgroup controller"; return; }
  command -v ip >/dev/null || { echo "iproute2 is missing"; return; }
  command -v unshare >/dev/null || { echo "util-linux (unshare) is missing"; return; }
  command -v apt-get >/dev/null || dpkg-query -W containerd >/dev/null 2>&1 ||
    { echo "needs Debian's containerd and runc (apt-get is missing)"; return; }
  ip link add nsfac-probe type veth peer name nsfac-probe2 2>/dev/null || { echo "the kernel cannot create veth pairs"; return; }
  ip link add link nsfac-probe name nsfac-probe3 type macvlan mode bridge 2>/dev/null ||
    { ip link del nsfac-probe; echo "the kernel has no macvlan (the data network)"; return; }
  ip link del nsfac-probe
}

# A sysfs view of N CPUs on one NUMA node (cpu/ and node/ of /sys/devices/system, as the
# kubelet's cAdvisor and the agent's topology read them), which the node's mount namespace puts
# over the real ones: the kubelet then offers N CPUs and the node daemon (its hostPath /sys)
# publishes N. It is an overcommit, not more cores: with cpuManagerPolicy none no pod is pinned,
# and pods (their own sysfs, their cgroup's CPUs) run on the machine's real CPUs.
sysfs_view() { # node cpus
  local v="$FAC/$1/sysview" n=$2 last=$(($2 - 1)) c
  rm -rf "$v"
  mkdir -p "$v/cpu" "$v/node/node0"
  for f in online possible present; do echo "0-$last" >"$v/cpu/$f"; done
  for c in $(seq 0 "$last"); do
    mkdir -p "$v/cpu/cpu$c/topology"
    echo "$c" >"$v/cpu/cpu$c/topology/core_id"
    echo 0 >"$v/cpu/cpu$c/topology/physical_package_id"
    echo 0 >"$v/cpu/cpu$c/topology/die_id"
    echo "$c" >"$v/cpu/cpu$c/topology/thread_siblings_list"
    echo "0-$last" >"$v/cpu/cpu$c/topology/core_siblings_list"
    ((c == 0)) || echo 1 >"$v/cpu/cpu$c/online"
    ln -s "../../cpu/cpu$c" "$v/node/node0/cpu$c"
  done
  for f in online possible has_cpu has_memory has_normal_memory; do echo 0 >"$v/node/$f"; done
  echo "0-$last" >"$v/node/node0/cpulist"
  printf '%x\n' $(((1 << n) - 1)) >"$v/node/node0/cpumap"
  echo 10 >"$v/node/node0/distance"
  cp /sys/devices/system/node/node0/meminfo "$v/node/node0/meminfo"
  for h in /sys/devices/system/node/node0/hugepages/*/; do
    mkdir -p "$v/node/node0/hugepages/$(basename "$h")"
    for f in free_hugepages nr_hugepages surplus_hugepages; do cat "$h$f" >"$v/node/node0/hugepages/$(basename "$h")/$f"; done
  done
}

# A two-NUMA node's data NICs in its mount namespace: each NIC's sysfs directory (a veth's, under
# devices/virtual/net) is covered by a view that names its NUMA node (nic_view) and keeps what
# else the kubelet reads of it (address, mtu, ifindex, type, carrier), so the node daemon (its
# hostPath /sys) publishes the NIC's node and its device plugin gives the kubelet that hint.
nic_views() { # node
  local n=$1 nic v
  for nic in ${NUMA_VIEW[$n]:-}; do
    v="$FAC/$n/sysview/net/${nic%%:*}"
    printf 'mkdir -p %s\n' "$v"
    printf 'for f in address mtu ifindex type carrier flags; do cat /sys/class/net/%s/$f >%s/$f 2>/dev/null || true; done\n' "${nic%%:*}" "$v"
    printf 'source %s/hack/lib/numa-view.sh; nic_view %s %s\n' "$PWD" "$v" "${nic#*:}"
    printf 'mount --bind %s /sys/devices/virtual/net/%s\n' "$v" "${nic%%:*}"
  done
}

# The node's own processes run under one shell that made the node's mount namespace (inside its
# network namespace), so containerd, runc, the CNI plugins and the kubelet all see the node's
# /var/lib/kubelet, /var/lib/cni, /etc/cni/net.d and /var/log/pods.
node_script() { # node
  local n=$1 d="$FAC/$1"
  cat <<EOF
set -e
mount --make-rprivate /
# ip netns exec mounted a fresh sysfs (this namespace's interfaces) over /sys, hiding the cgroup
# file systems: mount them again, as the host has them.
if ! grep -q " /sys/fs/cgroup " /proc/self/mounts; then
  mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup
  grep -E '^[^ ]+ /sys/fs/cgroup/[^ ]+ cgroup2? ' /proc/1/mounts | while read -r _ dir type opts _; do
    mkdir -p "\$dir"
    mount -t "\$type" -o "\$opts" cgroup "\$dir"
  done
  grep -qE '^[^ ]+ /sys/fs/cgroup cgroup2 ' /proc/1/mounts && mount -t cgroup2 cgroup2 /sys/fs/cgroup
fi
for m in var-lib-kubelet:/var/lib/kubelet var-lib-cni:/var/lib/cni net.d:/etc/cni/net.d pod-logs:/var/log/pods netns:/run/netns; do
  mkdir -p "$d/\${m%%:*}" "\${m#*:}"
  mount --bind "$d/\${m%%:*}" "\${m#*:}"
done
$(if [[ -n "${CPU_VIEW[$n]:-}${NUMA_VIEW[$n]:-}" ]]; then printf 'mount --bind %s /sys/devices/system/cpu\nmount --bind %s /sys/devices/system/node\n' "$d/sysview/cpu" "$d/sysview/node"; fi)
$(nic_views "$n")
sysctl -qw net.ipv4.ip_forward=1
$(netpol_divert)
containerd --config "$d/containerd.toml" >"$d/containerd.log" 2>&1 &
echo \$! >"$d/containerd.pid"
for _ in \$(seq 80); do ctr --address "$d/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.25; done
for img in "$FAC"/images/*.tar; do ctr --address "$d/containerd.sock" -n k8s.io images import "\$img" >/dev/null; done
exec "$KUBELET" --config "$d/kubelet.yaml" --kubeconfig "$FAC/kubelet.kubeconfig" --root-dir /var/lib/kubelet \
  --cert-dir "$d/pki" --hostname-override "$n" --node-ip "${MGMT_IP[$n]}" --v=1 >"$d/kubelet.log" 2>&1
EOF
}

# The NetworkPolicy enforcer's share of the node's netfilter: kube-network-policies' rules, as
# iptables (legacy: its NFQUEUE target is the kernel's xt one, not nftables' queue). After routing
# and bridging (bridged packets pass iptables too), the first packet of every connection from or
# to a pod goes to queue $NETPOL_QUEUE, where the enforcer accepts or drops it; with no enforcer
# listening it is dropped (fail closed, kube-network-policies' default). Established connections
# and the node's own root processes (the kubelet's probes) pass, as in its own rules.
NETPOL_QUEUE=100
netpol_divert() {
  cat <<EOF
sysctl -qw net.bridge.bridge-nf-call-iptables=1
iptables-legacy -t mangle -N NETPOL-DIVERT
iptables-legacy -t mangle -A NETPOL-DIVERT -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
iptables-legacy -t mangle -A NETPOL-DIVERT -m owner --uid-owner 0 -j RETURN
iptables-legacy -t mangle -A NETPOL-DIVERT -s 10.244.0.0/16 -j NFQUEUE --queue-num $NETPOL_QUEUE
iptables-legacy -t mangle -A NETPOL-DIVERT -d 10.244.0.0/16 -j NFQUEUE --queue-num $NETPOL_QUEUE
iptables-legacy -t mangle -A POSTROUTING -j NETPOL-DIVERT
EOF
}

# kube-network-policies on every node, as its own DaemonSet runs it (host network, NET_ADMIN, a
# service account that reads pods, namespaces and NetworkPolicies); done when both are Ready.
network_policies() {
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-network-policies, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-network-policies}
rules:
  - {apiGroups: [""], resources: [pods, namespaces, nodes], verbs: [get, list, watch]}
  - {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-network-policies}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-network-policies}
subjects: [{kind: ServiceAccount, name: kube-network-policies, namespace: kube-system}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-network-policies, namespace: kube-system}
spec:
  selector: {matchLabels: {app: kube-network-policies}}
  template:
    metadata: {labels: {app: kube-network-policies}}
    spec:
      hostNetwork: true
      serviceAccountName: kube-network-policies
      nodeSelector: {numastream.io/facility: box}
      tolerations: [{operator: Exists}]
      containers:
        - name: kube-network-policies
          image: $KNP_IMAGE
          imagePullPolicy: Never
          args: ["--hostname-override=\$(NODE_NAME)", --nfqueue-id=$NETPOL_QUEUE, --disable-nri, --netfilter-bug-1766-fix=false,
                 --metrics-bind-address=127.0.0.1:9080, --v=2]
          env:
            - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: KUBERNETES_SERVICE_HOST, value: "$HOST_IP"}
            - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
          securityContext: {capabilities: {add: [NET_ADMIN]}}
EOF
  k -n kube-system rollout status ds/kube-network-policies --timeout=120s >/dev/null ||
    { echo "facility: kube-network-policies did not become ready" >&2; k -n kube-system get pods -o wide >&2
      k -n kube-system logs ds/kube-network-policies --tail=20 >&2; return 1; }
  log "NetworkPolicy: kube-network-policies $KNP_VERSION on ${NODES[*]} (iptables NFQUEUE $NETPOL_QUEUE diverts new pod connections to it)"
}

# Runs a command in a node's network and mount namespaces (those of its containerd).
node_exec() { # node cmd...
  local n=$1; shift
  nsenter -t "$(cat "$FAC/$n/containerd.pid")" -m -n -- "$@"
}

network() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for n in "${NODES[@]}"; do
    local N; N=$(ns "$n")
    ip netns add "$N"
    ip link add "m-$n" type veth peer name mgmt0 netns "$N"
    ip link set "m-$n" master "$BRIDGE" up
    ip -n "$N" addr add "${MGMT_IP[$n]}/24" dev mgmt0
    ip -n "$N" link set mgmt0 up
    ip -n "$N" link set lo up
    ip -n "$N" route add default via "$HOST_IP"
    ip route add "${POD_NET[$n]}.0/24" via "${MGMT_IP[$n]}"
  done
  # Pod networks between the nodes, straight over the management bridge.
  local a b
  for a in "${NODES[@]}"; do
    for b in "${NODES[@]}"; do
      [[ $a == "$b" ]] || ip -n "$(ns "$a")" route add "${POD_NET[$b]}.0/24" via "${MGMT_IP[$b]}"
    done
  done
  # The facility link: each node's fab0 is a veth into one bridge of its own namespace (the
  # switch), shaped at the node's end. Each node's own address on it is for host-network
  # pipelines (the node daemon publishes it as numastream.io/nic.fab0.ipv4); the pods' macvlan
  # attachments use 10.215.0.10-199.
  ip netns add "$LINK_NS"
  ip -n "$LINK_NS" link add fab type bridge
  ip -n "$LINK_NS" link set fab up
  for n in "${NODES[@]}"; do
    local N; N=$(ns "$n")
    ip link add "fab-$n" netns "$LINK_NS" type veth peer name fab0 netns "$N"
    ip -n "$LINK_NS" link set "fab-$n" master fab up
    ip -n "$N" addr add "${LINK_IP[$n]}/24" dev fab0
    ip -n "$N" link set fab0 up
    ip netns exec "$N" tc qdisc add dev fab0 root tbf rate "$LINK_RATE" burst 256kb latency 100ms
    local nic
    for nic in ${NUMA_VIEW[$n]:-}; do
      nic=${nic%%:*}
      [[ $nic == fab0 ]] && continue
      ip -n "$N" link add "$nic" type veth peer name "${nic}p"
      ip -n "$N" link set "$nic" up
      ip -n "$N" link set "${nic}p" up
    done
    if [[ "$LINK_LOSS" != 0 ]]; then
      ip netns exec "$N" nft add table inet facility
      ip netns exec "$N" nft add chain inet facility out '{ type filter hook output priority 0; }'
      ip netns exec "$N" nft add rule inet facility out oifname fab0 numgen random mod 1000 \< "$((${LINK_LOSS%.*} * 10))" drop
    fi
  done
  log "networks: management $BRIDGE $HOST_IP/24; facility link fab0 $LINK_RATE (loss ${LINK_LOSS}%): $(for n in "${NODES[@]}"; do printf '%s %s ' "$n" "${LINK_IP[$n]}"; done)"
}

cni_config() { # node
  local n=$1 d="$FAC/$1"
  mkdir -p "$d/net.d"
  cat >"$d/net.d/00-multus.conf" <<EOF
{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus",
 "kubeconfig":"$FAC/multus.kubeconfig","binDir":"$FAC/cni-bin","cniDir":"/var/lib/cni/multus",
 "logFile":"$d/multus.log","logLevel":"error",
 "namespaceIsolation":true,"globalNamespaces":"kube-system",
 "delegates":[{"cniVersion":"0.4.0","name":"facility-pods","plugins":[
   {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,
    "ipam":{"type":"host-local","ranges":[[{"subnet":"${POD_NET[$n]}.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
   {"type":"loopback"}]}]}
EOF
}

# The CPU manager of a node's kubelet: none (2 CPUs per node, nothing pinned by the kubelet), or on
# a two-NUMA node the static CPU manager and Topology Manager as a facility runs them: 100m
# reserved for the kubelet makes the static policy reserve CPU 0 and leaves 1.9 allocatable.
cpu_manager() { # node
  if [[ -n "${NUMA_VIEW[$1]:-}" ]]; then
    printf 'cpuManagerPolicy: static\nkubeReserved: {cpu: 100m}\ntopologyManagerPolicy: restricted\ntopologyManagerScope: container\n'
  else
    echo "cpuManagerPolicy: none"
  fi
}

node_config() { # node
  local n=$1 d="$FAC/$1"
  mkdir -p "$d"/{pki,var-lib-kubelet,var-lib-cni,pod-logs,netns}
  containerd config default >"$d/containerd.toml"
  sed -i -e "s#^root = .*#root = \"$d/containerd-root\"#" \
         -e "s#^state = .*#state = \"$d/containerd-state\"#" \
         -e "s#address = \"/run/containerd/containerd.sock\"#address = \"$d/containerd.sock\"#" \
         -e "s#bin_dir = \"/opt/cni/bin\"#bin_dir = \"$FAC/cni-bin\"#" \
         -e "s#conf_dir = \"/etc/cni/net.d\"#conf_dir = \"$d/net.d\"#" \
         -e 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' \
         -e 's#max_conf_num = 1#max_conf_num = 1#' \
         "$d/containerd.toml"
  if [[ -n "${RELEASE_DIR:-}" ]]; then
    sed -i -e "s#config_path = \"\"#config_path = \"$d/certs.d\"#" "$d/containerd.toml"
    grep -q "config_path = \"$d/certs.d\"" "$d/containerd.toml" ||
      { echo "facility: cannot set containerd's registry config_path for $n" >&2; return 1; }
    mkdir -p "$d/certs.d/$REGISTRY"
    printf 'server = "https://%s"\n[host."https://%s"]\n  capabilities = ["pull", "resolve"]\n  ca = "%s"\n' \
      "$REGISTRY" "$REGISTRY" "$FAC/registry/certs/ca.crt" >"$d/certs.d/$REGISTRY/hosts.toml"
  fi
  if [[ -n "${NUMA_VIEW[$n]:-}" ]]; then
    # Every container's own sysfs gets the node's NUMA view too (hack/runc-numa-view).
    printf '#!/bin/sh\nexec %s %s/hack/runc-numa-view %s %s "$@"\n' "$(command -v python3)" "$PWD" "$d/sysview" "$(command -v runc)" >"$d/runc"
    chmod +x "$d/runc"
    sed -i -e "s#BinaryName = \"\"#BinaryName = \"$d/runc\"#" "$d/containerd.toml"
    grep -q "BinaryName = \"$d/runc\"" "$d/containerd.toml" ||
      { echo "facility: cannot set containerd's runc BinaryName for $n" >&2; return 1; }
  fi
  # Its own cgroup root in every hierarchy, so the two kubelets never see each other's pods.
  for c in /sys/fs/cgroup/*/; do
    [[ -d "$c" && ! -L "${c%/}" ]] && mkdir -p "$c/numastream-$n"
  done
  if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then # v1: a new cpuset starts empty
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/numastream-$n/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/numastream-$n/cpuset.mems"
  fi
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /numastream-$n
containerRuntimeEndpoint: unix://$d/containerd.sock
$(cpu_manager "$n")
failSwapOn: false
address: ${MGMT_IP[$n]}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "100Mi"}
# The images were imported, not pulled (no registry is reachable): the kubelet must never
# garbage-collect them, whatever the host's disk usage (it removed the sandbox image at 85%).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: /var/log/pods
maxPods: 30
EOF
  # A node shown more CPUs than the machine has keeps its pods' cgroups flat under its root: with
  # QoS cgroups the kubelet would give kubepods a cpuset of every CPU it sees (policy none),
  # which the kernel refuses for CPUs that do not exist.
  [[ -z "${CPU_VIEW[$n]:-}" ]] || printf 'cgroupsPerQOS: false\nenforceNodeAllocatable: []\n' >>"$d/kubelet.yaml"
  cni_config "$n"
  [[ -z "${CPU_VIEW[$n]:-}" ]] || sysfs_view "$n" "${CPU_VIEW[$n]}"
  [[ -z "${NUMA_VIEW[$n]:-}" ]] || numa_view_system "$d/sysview"
  node_script "$n" >"$d/run.sh"
}

kubeconfigs() {
  # Nodes, Multus and nfd-master reach the API server on the management bridge.
  sed "s#https://127.0.0.1:$API_PORT#https://$HOST_IP:$API_PORT#" "$KUBECONFIG" >"$FAC/kubelet.kubeconfig"
  cp "$FAC/kubelet.kubeconfig" "$FAC/multus.kubeconfig"
  k --kubeconfig "$FAC/kubelet.kubeconfig" get --raw /readyz >/dev/null ||
    { echo "facility: the API server is not reachable at https://$HOST_IP:$API_PORT (start it with API_BIND=0.0.0.0 API_ADVERTISE=$HOST_IP)" >&2; exit 1; }
}

cni_bin() {
  mkdir -p "$FAC/cni-bin"
  for p in /usr/lib/cni/*; do ln -sf "$p" "$FAC/cni-bin/"; done
  cp "$FAC_BIN/multus" "$FAC/cni-bin/multus"
}

attachments() {
  k apply -f config/facility/network-attachment-definition-crd.yaml >/dev/null
  k wait --for condition=established --timeout=60s crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
  local side range ns
  # Multus admits a pod only to the attachments of its own namespace (namespaceIsolation): the
  # namespaces the admin puts on the data network each get theirs. The leases of the link's
  # addresses are one directory every node's host-local shares (each node's /var/lib/cni is its
  # own), so two detector nodes never hand out the same address.
  mkdir -p "$FAC/link-leases"
  for ns in $DATA_NAMESPACES; do
    k get namespace "$ns" >/dev/null 2>&1 || k create namespace "$ns" >/dev/null
    for side in detector gateway; do
      [[ $side == detector ]] && range="10.215.0.10 10.215.0.99" || range="10.215.0.100 10.215.0.199"
      k apply -f - >/dev/null <<EOF
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: data-$side
  namespace: $ns
spec:
  config: '{"cniVersion":"0.4.0","name":"data-$side","type":"macvlan","master":"fab0","mode":"bridge","ipam":{"type":"host-local","dataDir":"$FAC/link-leases","ranges":[[{"subnet":"10.215.0.0/24","rangeStart":"${range% *}","rangeEnd":"${range#* }"}]]}}'
EOF
    done
  done
  log "NetworkAttachmentDefinitions data-detector (10.215.0.10-99) and data-gateway (10.215.0.100-199) on fab0 in $DATA_NAMESPACES (Multus namespace isolation)"
}

nfd_master() {
  k apply --server-side -f "$FAC_BIN/nfd-crds.yaml" >/dev/null
  k create namespace node-feature-discovery --dry-run=client -o yaml | k apply -f - >/dev/null
  NODE_NAME=gateway-a "$FAC_BIN/nfd-master" -kubeconfig "$KUBECONFIG" -extra-label-ns numastream.io -metrics 0 -grpc-health 0 \
    -config /dev/null -resync-period 10s >"$FAC/nfd-master.log" 2>&1 &
  echo $! >"$FAC/nfd-master.pid"
  log "nfd-master $("$FAC_BIN/nfd-master" -version 2>&1 | head -1) running (labels from NodeFeature objects, extra label namespace numastream.io)"
}

up() {
  local why; why=$(why_not)
  [[ -z "$why" ]] || { echo "facility: cannot run here: $why" >&2; exit 1; }
  for f in "$KUBELET" "$FAC_BIN/multus" "$FAC_BIN/nfd-master"; do
    [[ -x "$f" ]] || { echo "facility: $f is missing (make k8s-bins-node facility-bins)" >&2; exit 1; }
  done
  [[ -f "$FAC_BIN/kube-network-policies.tar" ]] ||
    { echo "facility: $FAC_BIN/kube-network-policies.tar is missing (make facility-bins)" >&2; exit 1; }
  ls "$FAC"/images/*.tar >/dev/null 2>&1 || [[ -n "${IMAGES_DIR:-}${RELEASE_DIR:-}" ]] ||
    { echo "facility: no images in $FAC/images (hack/images.sh builds them)" >&2; exit 1; }
  (down) >/dev/null 2>&1 || true
  bash hack/install-deps.sh test
  mkdir -p "$FAC/images"
  if [[ -n "${RELEASE_DIR:-}" ]]; then
    # The product's images come from the registry; only the sandbox is imported.
    bash hack/sandbox-image.sh "$FAC/images/sandbox.tar"
  else
    [[ -n "${IMAGES_DIR:-}" ]] && cp "$IMAGES_DIR"/*.tar "$FAC/images/"
  fi
  cp "$FAC_BIN/kube-network-policies.tar" "$FAC/images/"
  network
  [[ -z "${RELEASE_DIR:-}" ]] || registry_up
  kubeconfigs
  cni_bin
  for n in "${NODES[@]}"; do
    node_config "$n"
    ip netns exec "$(ns "$n")" unshare -m bash "$FAC/$n/run.sh" &
    echo $! >"$FAC/$n/launcher.pid"
  done
  attachments
  local n
  for n in "${NODES[@]}"; do
    { k wait --for=create "node/$n" --timeout=60s && k wait --for=condition=Ready "node/$n" --timeout=60s; } >/dev/null ||
      { echo "facility: node $n did not become Ready; $FAC/$n/kubelet.log:" >&2; tail -20 "$FAC/$n/kubelet.log" >&2; exit 1; }
    k label node "$n" numastream.io/facility=box --overwrite >/dev/null
    log "node $n Ready ($(k get node "$n" -o jsonpath='{.status.allocatable.cpu}') CPUs allocatable${CPU_VIEW[$n]:+ (a view: the machine has $(nproc))}${NUMA_VIEW[$n]:+, two NUMA nodes (CPU 0 node 0, CPU 1 node 1; NICs ${NUMA_VIEW[$n]}), static CPU manager, Topology Manager restricted}, pods ${POD_NET[$n]}.0/24, InternalIP ${MGMT_IP[$n]})"
  done
  network_policies
  nfd_master
}

# The release's images in the box's registry (see the top): a CA and a server certificate for
# the host's facility address, one user, the images pushed from the release's OCI archives with
# their digests kept (skopeo --preserve-digests fails rather than rewrite a manifest).
registry_up() {
  local r="$FAC/registry" f c version
  [[ -f "$RELEASE_DIR/SHA256SUMS" ]] || { echo "facility: $RELEASE_DIR is not a release (make release)" >&2; return 1; }
  (cd "$RELEASE_DIR" && sha256sum --quiet -c SHA256SUMS) || { echo "facility: $RELEASE_DIR fails its SHA256SUMS" >&2; return 1; }
  mkdir -p "$r/data" "$r/certs"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=numastream facility box CA" \
    -keyout "$r/ca.key" -out "$r/certs/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$HOST_IP" -keyout "$r/tls.key" -out "$r/tls.csr" 2>/dev/null
  openssl x509 -req -in "$r/tls.csr" -CA "$r/certs/ca.crt" -CAkey "$r/ca.key" -CAcreateserial -days 2 \
    -extfile <(printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "$HOST_IP") -out "$r/tls.crt" 2>/dev/null
  head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$r/password"
  chmod 600 "$r/password" "$r/ca.key" "$r/tls.key"
  htpasswd -Bbn facility "$(cat "$r/password")" >"$r/htpasswd"
  printf '%s\n' "version: 0.1" "log: {level: warn}" "storage: {filesystem: {rootdirectory: $r/data}}" \
    "http: {addr: \"$REGISTRY\", tls: {certificate: $r/tls.crt, key: $r/tls.key}}" \
    "auth: {htpasswd: {realm: numastream-facility, path: $r/htpasswd}}" >"$r/config.yml"
  docker-registry serve "$r/config.yml" >"$FAC/registry.log" 2>&1 &
  echo $! >"$FAC/registry.pid"
  local code=""
  for _ in $(seq 40); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$r/certs/ca.crt" "https://$REGISTRY/v2/" || true)
    [[ $code == 401 ]] && break
    sleep 0.25
  done
  [[ $code == 401 ]] || { echo "facility: the registry at $REGISTRY does not ask for credentials (HTTP $code)" >&2; cat "$FAC/registry.log" >&2; return 1; }
  for f in "$RELEASE_DIR"/images/numastream-*.oci.tar; do
    c=$(basename "$f" .oci.tar); c=${c#numastream-}; version=${c#*-}; c=${c%%-*}
    skopeo copy -q --all --preserve-digests --dest-creds "facility:$(cat "$r/password")" --dest-cert-dir "$r/certs" \
      "oci-archive:$f" "docker://$REGISTRY/numastream/$c:$version" ||
      { echo "facility: cannot push $f to the registry" >&2; return 1; }
  done
  log "registry https://$REGISTRY (TLS, htpasswd): $(ls "$RELEASE_DIR"/images | tr '\n' ' ')pushed from $RELEASE_DIR"
}

# The chart helm installs: the release's package, or the tree's.
chart() {
  if [[ -n "${RELEASE_DIR:-}" ]]; then ls "$RELEASE_DIR"/numastream-*.tgz; else echo charts/numastream; fi
}

# The digest the release pinned for an image (agent, operator): its archive's manifest.
release_digest() {
  skopeo inspect --format '{{.Digest}}' "oci-archive:$(ls "$RELEASE_DIR"/images/numastream-"$1"-*.oci.tar)"
}

# The operator (namespace-scoped) and the node daemon, from the chart (test/facility/values.yaml:
# the images above, the API server's management address); done when nfd-master has labelled every node from the
# node daemon's NodeFeature objects.
install() {
  local helm="${HELM:-$HOME/.cache/numastream/k8s-1.36.4/helm}" hh="$FAC/helm"
  mkdir -p "$hh"
  # The box's tenant namespace, as a facility's admin makes one: Pod Security restricted. The
  # operator is installed namespace-scoped (values.yaml watchNamespaces): default and tenant-a.
  k get namespace tenant-a >/dev/null 2>&1 || k create namespace tenant-a >/dev/null
  k label --overwrite namespace tenant-a pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest >/dev/null
  local from_registry=()
  if [[ -n "${RELEASE_DIR:-}" ]]; then
    # The pull secret, where the operator, the node daemon and the agent pods run.
    local sns
    for sns in numastream-system default tenant-a; do
      k get namespace "$sns" >/dev/null 2>&1 || k create namespace "$sns" >/dev/null
      k -n "$sns" create secret docker-registry "$PULL_SECRET" --docker-server="$REGISTRY" --docker-username=facility \
        --docker-password="$(cat "$FAC/registry/password")" --dry-run=client -o yaml | k apply -f - >/dev/null
    done
    from_registry=(--set "agentImage.repository=$REGISTRY/numastream/agent" --set agentImage.pullPolicy=IfNotPresent
      --set "operator.image.repository=$REGISTRY/numastream/operator" --set operator.image.pullPolicy=IfNotPresent
      --set "imagePullSecrets[0].name=$PULL_SECRET" --set "agentPods.imagePullSecrets[0].name=$PULL_SECRET")
  fi
  HELM_CACHE_HOME=$hh HELM_CONFIG_HOME=$hh HELM_DATA_HOME=$hh "$helm" upgrade --install numastream "$(chart)" \
    -n numastream-system --create-namespace -f test/facility/values.yaml "${from_registry[@]}" --wait --timeout 120s >"$FAC/helm.log" 2>&1 ||
    { cat "$FAC/helm.log"; return 1; }
  local n
  for n in "${NODES[@]}"; do
    for _ in $(seq 240); do
      [[ -n "$(k get node "$n" -o jsonpath='{.metadata.labels.numastream\.io/nic\.fab0\.speed-mbit}')" ]] && break
      sleep 0.5
    done
    [[ -n "$(k get node "$n" -o jsonpath='{.metadata.labels.numastream\.io/nic\.fab0\.speed-mbit}')" ]] ||
      { echo "node $n: no NFD labels from the node daemon after 120 s" >&2; k -n numastream-system logs ds/numastream-node-daemon --tail=20 >&2; return 1; }
    # And its NIC tokens (the daemon's device plugin, registered with the kubelet): a gateway pod
    # that asks for one before the kubelet has them is Unschedulable for that moment.
    for _ in $(seq 240); do
      [[ -n "$(k get node "$n" -o jsonpath='{.status.allocatable.numastream\.io/nic-fab0}')" ]] && break
      sleep 0.5
    done
    [[ -n "$(k get node "$n" -o jsonpath='{.status.allocatable.numastream\.io/nic-fab0}')" ]] ||
      { echo "node $n: no numastream.io/nic-fab0 tokens from the node daemon's device plugin after 120 s" >&2; return 1; }
  done
  log "helm: numastream installed from $(chart) (operator $(k -n numastream-system get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].spec.nodeName}'), node daemon on ${NODES[*]}); NFD labels: $(k get node gateway-a --show-labels | tr ',' '\n' | grep -c numastream.io/) on gateway-a"
}

# `helm upgrade` to another agent image, as a facility does after building one: the agent image
# gets tag $1 (the same bytes: a rebuild here would give them too) — in the registry, or in each
# node's containerd — and the release is upgraded to it by tag, with its other values kept.
upgrade_agent() {
  local tag=$1 helm="${HELM:-$HOME/.cache/numastream/k8s-1.36.4/helm}" hh="$FAC/helm" n by_tag=()
  if [[ -n "${RELEASE_DIR:-}" ]]; then
    local r="$FAC/registry" creds; creds="facility:$(cat "$FAC/registry/password")"
    skopeo copy -q --all --preserve-digests --src-creds "$creds" --dest-creds "$creds" --src-cert-dir "$r/certs" --dest-cert-dir "$r/certs" \
      "docker://$REGISTRY/numastream/agent@$(release_digest agent)" "docker://$REGISTRY/numastream/agent:$tag" ||
      { echo "facility: cannot tag the agent image $tag in the registry" >&2; return 1; }
    by_tag=(--set-string agentImage.digest=)
  else
    for n in "${NODES[@]}"; do
      node_exec "$n" ctr --address "$FAC/$n/containerd.sock" -n k8s.io images tag --force \
        docker.io/numastream/agent:facility "docker.io/numastream/agent:$tag" >/dev/null
    done
  fi
  HELM_CACHE_HOME=$hh HELM_CONFIG_HOME=$hh HELM_DATA_HOME=$hh "$helm" upgrade numastream "$(chart)" \
    -n numastream-system --reset-then-reuse-values --set "agentImage.tag=$tag" "${by_tag[@]}" --wait --timeout 120s >"$FAC/helm-upgrade.log" 2>&1 ||
    { cat "$FAC/helm-upgrade.log"; return 1; }
  log "helm upgrade: agent image $(k -n numastream-system get ds numastream-node-daemon -o jsonpath='{.spec.template.spec.containers[0].image}')"
}

# helm upgrade to N operator replicas: with more than one, leader election (a Lease in the
# release namespace); with one, none (and the Deployment is replaced with Recreate).
operator_replicas() {
  local n=$1 helm="${HELM:-$HOME/.cache/numastream/k8s-1.36.4/helm}" hh="$FAC/helm" elect=false
  [[ $n -gt 1 ]] && elect=true
  HELM_CACHE_HOME=$hh HELM_CONFIG_HOME=$hh HELM_DATA_HOME=$hh "$helm" upgrade numastream "$(chart)" \
    -n numastream-system --reset-then-reuse-values --set "operator.replicas=$n" --set "operator.leaderElect=$elect" --wait --timeout 180s \
    >"$FAC/helm-upgrade.log" 2>&1 || { cat "$FAC/helm-upgrade.log"; return 1; }
  log "helm upgrade: $n operator replicas (leader election $elect)"
}

# The facility link's byte counters, as seen from each node.
link_bytes() {
  for n in "${NODES[@]}"; do
    printf '%s fab0 rx_bytes %s tx_bytes %s\n' "$n" \
      "$(ip netns exec "$(ns "$n")" cat /sys/class/net/fab0/statistics/rx_bytes)" \
      "$(ip netns exec "$(ns "$n")" cat /sys/class/net/fab0/statistics/tx_bytes)"
  done
}

down() {
  set +e
  if [[ -f "$KUBECONFIG" ]]; then
    for n in "${NODES[@]}"; do
      k delete pods --all-namespaces --field-selector "spec.nodeName=$n" --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1
    done
  fi
  [[ -f "$FAC/nfd-master.pid" ]] && kill "$(cat "$FAC/nfd-master.pid")" 2>/dev/null
  [[ -f "$FAC/registry.pid" ]] && kill "$(cat "$FAC/registry.pid")" 2>/dev/null
  for n in "${NODES[@]}"; do
    local d="$FAC/$n"
    if [[ -f "$d/containerd.pid" ]] && kill -0 "$(cat "$d/containerd.pid")" 2>/dev/null; then
      pkill -f -- "--hostname-override $n " 2>/dev/null
      sleep 0.5
      for t in $(node_exec "$n" ctr --address "$d/containerd.sock" -n k8s.io t ls -q 2>/dev/null); do
        node_exec "$n" ctr --address "$d/containerd.sock" -n k8s.io t kill -s SIGKILL "$t" >/dev/null 2>&1
      done
      sleep 1
      for t in $(node_exec "$n" ctr --address "$d/containerd.sock" -n k8s.io t ls -q 2>/dev/null); do
        node_exec "$n" ctr --address "$d/containerd.sock" -n k8s.io t rm -f "$t" >/dev/null 2>&1
      done
      kill "$(cat "$d/containerd.pid")" 2>/dev/null
    fi
    [[ -f "$d/launcher.pid" ]] && kill "$(cat "$d/launcher.pid")" 2>/dev/null
  done
  sleep 1
  # Processes left in a node's network namespace (containerd shims, pods) go with it.
  for n in "${NODES[@]}"; do
    local pids; pids=$(ip netns pids "$(ns "$n")" 2>/dev/null)
    [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
  done
  sleep 0.5
  for n in "${NODES[@]}"; do
    [[ -f "$KUBECONFIG" ]] && k delete node "$n" --wait=false >/dev/null 2>&1
    ip netns del "$(ns "$n")" 2>/dev/null
    ip route del "${POD_NET[$n]}.0/24" 2>/dev/null
    ip link del "m-$n" 2>/dev/null
    # Anything still in the node's cgroups (a `runc init` caught half-way when containerd went,
    # in a pod's network namespace) is killed; then the cgroups go, retried while it exits.
    local try
    for try in $(seq 20); do
      compgen -G "/sys/fs/cgroup/*/numastream-$n" >/dev/null || break
      local procs; procs="$(find /sys/fs/cgroup/*/numastream-"$n" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\n' ' ')"
      [[ -n "${procs// /}" ]] && kill -9 $procs 2>/dev/null
      for c in /sys/fs/cgroup/*/numastream-"$n"; do
        [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
      done
      sleep 0.25
    done
  done
  ip link del "$BRIDGE" 2>/dev/null
  ip netns del "$LINK_NS" 2>/dev/null
  grep -o " $FAC[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  for n in "${NODES[@]}"; do rm -rf "${FAC:?}/$n"; done
  rm -rf "$FAC"/link-leases "$FAC"/cni-bin "$FAC"/registry "$FAC"/*.pid "$FAC"/*.kubeconfig "$FAC"/*.log
  [[ "${KEEP_IMAGES:-0}" == 1 ]] || rm -rf "$FAC"
  log "facility down, cleaned up"
}

# Fails, naming it, when anything of the facility is left behind.
check_clean() {
  local left=()
  for n in "${NODES[@]}"; do
    ip netns list 2>/dev/null | grep -qw "$(ns "$n")" && left+=("network namespace $(ns "$n")")
    compgen -G "/sys/fs/cgroup/*/numastream-$n" >/dev/null && left+=("cgroups numastream-$n")
    pgrep -f -- "--hostname-override $n " >/dev/null && left+=("kubelet of $n")
    ip link show "m-$n" >/dev/null 2>&1 && left+=("link m-$n")
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
  ip netns list 2>/dev/null | grep -qw "$LINK_NS" && left+=("network namespace $LINK_NS")
  grep -q " $FAC" /proc/mounts && left+=("mounts under $FAC")
  pgrep -f "$FAC" >/dev/null && left+=("processes: $(pgrep -af "$FAC" | head -3 | tr '\n' ';')")
  ((${#left[@]} == 0)) || { printf 'facility left behind: %s\n' "${left[@]}"; return 1; }
  echo "facility: nothing left behind (namespaces, cgroups, processes, links, mounts)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) why=$(why_not); [[ -z "$why" ]] || { echo "$why"; exit 1; } ;;
  clean) check_clean ;;
  link-bytes) link_bytes ;;
  install) install ;;
  upgrade-agent) upgrade_agent "$2" ;;
  operator-replicas) operator_replicas "$2" ;;
  exec) shift; node_exec "$@" ;;
  *) echo "usage: $0 up|install|down|check|clean|link-bytes|exec NODE CMD..." >&2; exit 2 ;;
esac
