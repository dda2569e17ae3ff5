#!/usr/bin/env bash
# One REAL Kubernetes node next to the simulated facility cluster (hack/sim-cluster.sh):
#   - Debian's containerd and runc;
#   - a kubelet built from the Go module proxy (make k8s-bins-node), with the static CPU manager
#     (CPU 0 reserved for the system) and Topology Manager (restricted, container scope), that
#     sees TWO NUMA nodes: it runs in a mount namespace of its own where a sysfs view (numa_view)
#     puts CPU 0 on node 0 and CPU 1 on node 1 -- the machine's own CPUs, so the cpusets the CPU
#     manager writes are real; memory stays one real node, split in the view;
#   - two data NICs in that view, nsreal0 on node 1 and nsreal1 on node 0, whose locality the
#     node daemon (reading the same view, --sysfs-root) gives the kubelet through its device plugin;
#   - numastream's node daemon, its device plugin registered with this kubelet;
#   - the agent image assembled from what the build produced (same binary, user and entrypoint
#     as the Dockerfile's `agent` target) and a busybox sandbox image, imported into containerd:
#     no registry and no container engine are needed.
# The node's address is on a veth interface of its own, so `kubectl logs` works. Pods use host networking.
#
#   real-node.sh up | down | check        (root; `check` says why this host cannot, and exits 1)
#   real-node.sh topology-policy POLICY  (restarts the kubelet with that Topology Manager policy)
#
# Environment: KUBELET_BIN (dir with kubelet), SIM_BIN (dir with kubectl), SIM_DIR, NODE,
# REAL_NODE_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib/numa-view.sh
NODE="${NODE:-real-node}"
WORK="${REAL_NODE_DIR:-/tmp/numastream-real-node}"
SIM_DIR="${SIM_DIR:-/tmp/numastream-sim}"
KUBELET="${KUBELET_BIN:-$HOME/.cache/numastream/k8s-1.36.4-node}/kubelet"
KUBECTL="${SIM_BIN:-$HOME/.cache/numastream/k8s-1.36.4-sim}/kubectl"
export KUBECONFIG="$SIM_DIR/admin.kubeconfig"
NODE_IP="${NODE_IP:-10.213.0.1}"
LINK=nsreal0
SOCK="$WORK/containerd.sock"
# The kubelet's device-plugin directory is fixed (not under --root-dir).
PLUGIN_DIR=/var/lib/kubelet/device-plugins
AGENT_IMAGE=numastream/agent:real
k() { "$KUBECTL" "$@"; }
ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }
log() { echo "[$(date +%H:%M:%S.%3N)] $*"; }

# Why this host cannot run a real node, or nothing.
why_not() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root (containerd, kubelet, cgroups)"; return; }
  [[ -d /sys/fs/cgroup/cpuset || -f /sys/fs/cgroup/cgroup.controllers ]] || { echo "no cpuset cgroup controller"; return; }
  [[ $(nproc) -ge 2 ]] || { echo "the static CPU manager needs at least 2 CPUs (one is reserved)"; return; }
  command -v ip >/dev/null || { echo "iproute2 is missing"; return; }
  command -v apt-get >/dev/null || dpkg-query -W containerd >/dev/null 2>&1 ||
    { echo "needs Debian's containerd and runc (apt-get is missing)"; return; }
}

packages() { bash hack/install-deps.sh test; }

# The sysfs view of this node, at $WORK/sysroot (what the kubelet, the node daemon and the agents
# in its pods read as /sys): the machine's CPUs 0 and 1 on NUMA nodes 0 and 1
# (hack/lib/numa-view.sh), and the data NICs as class/net/<nic>/{device/numa_node,speed,operstate}.
NUMA_NICS="nsreal0:1 nsreal1:0"  # NIC:NUMA node
numa_view() {
  local v="$WORK/sysroot" nic
  rm -rf "$v"
  numa_view_system "$v/devices/system"
  for nic in $NUMA_NICS; do nic_view "$v/class/net/${nic%%:*}" "${nic#*:}"; done
}

# The images (hack/images.sh: the agent as the Dockerfile's agent target, a busybox sandbox),
# imported into this node's containerd.
images() {
  bash hack/images.sh "$WORK/images" "$AGENT_IMAGE" >/dev/null
  for t in "$WORK"/images/*.tar; do ctr_ images import "$t" >/dev/null; done
  rm -rf "$WORK/images"
  log "images imported: $AGENT_IMAGE, local.numastream/busybox:1 and the sandbox image"
}

# The kubelet in a mount namespace of its own, the view over /sys/devices/system/{cpu,node}:
# cAdvisor, the CPU manager and Topology Manager see two NUMA nodes.
start_kubelet() {
  unshare --mount --propagation private /bin/sh -c '
    mount --bind "$1/devices/system/cpu" /sys/devices/system/cpu &&
    mount --bind "$1/devices/system/node" /sys/devices/system/node &&
    shift && exec "$@"' numa-view "$WORK/sysroot" \
    "$KUBELET" --config "$WORK/kubelet.yaml" --kubeconfig "$KUBECONFIG" --root-dir "$WORK/kubelet-root" \
    --cert-dir "$WORK/pki" --hostname-override "$NODE" --node-ip "$NODE_IP" --v=1 >>"$WORK/kubelet.log" 2>&1 &
  echo $! >"$WORK/kubelet.pid"
}

# The kubelet restarted with another Topology Manager policy (restricted, single-numa-node, ...):
# done when it is healthy and the node daemon's device plugin has registered both NICs again.
topology_policy() { # policy
  local pid; pid=$(cat "$WORK/kubelet.pid")
  sed -i "s/^topologyManagerPolicy: .*/topologyManagerPolicy: $1/" "$WORK/kubelet.yaml"
  kill "$pid"
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  start_kubelet
  local ok=0
  for _ in $(seq 120); do
    if curl -fsS http://127.0.0.1:30248/healthz >/dev/null 2>&1 &&
      grep -q "topologyManagerPolicy\":\"$1\"" <(k get --raw "/api/v1/nodes/$NODE/proxy/configz" 2>/dev/null) &&
      [[ $(k get node "$NODE" -o jsonpath='{.status.allocatable}' | grep -Eo '"numastream.io/nic-nsreal[01]":"[1-9]' | wc -l) -eq 2 ]]; then
      ok=1; break
    fi
    sleep 0.5
  done
  ((ok)) || { echo "real-node: the kubelet did not come back with topologyManagerPolicy $1; see $WORK/kubelet.log" >&2; tail -20 "$WORK/kubelet.log" >&2; exit 1; }
  log "kubelet restarted with topologyManagerPolicy $1 (its /configz says so), both NICs registered again"
}

up() {
  local why; why=$(why_not)
  [[ -z "$why" ]] || { echo "real-node: cannot run here: $why" >&2; exit 1; }
  [[ -x "$KUBELET" ]] || { echo "real-node: no kubelet at $KUBELET (make k8s-bins-node)" >&2; exit 1; }
  [[ -f "$KUBECONFIG" ]] || { echo "real-node: the simulated cluster is not up ($KUBECONFIG missing)" >&2; exit 1; }
  packages
  (down) >/dev/null 2>&1 || true
  mkdir -p "$WORK"/{net.d,kubelet-root,features.d,pki}
  # The device-plugin directory is the one thing outside $WORK: remember whether it was ours.
  if [[ ! -e /var/lib/kubelet ]]; then touch "$WORK/created-var-lib-kubelet"; fi
  if pgrep -x kubelet >/dev/null; then echo "real-node: another kubelet runs on this host" >&2; exit 1; fi
  # The node's address, on one end of a veth pair (this kernel has no dummy interfaces).
  ip link add "$LINK" type veth peer name "${LINK}p"
  ip addr add "$NODE_IP/32" dev "$LINK"
  ip link set "$LINK" up
  ip link set "${LINK}p" up

  containerd config default >"$WORK/containerd.toml"
  # restrict_oom_score_adj: without CAP_SYS_RESOURCE runc cannot give the sandbox its
  # oom_score_adj of -998 and every pod fails to start.
  sed -i -e "s#^root = .*#root = \"$WORK/containerd-root\"#" \
         -e "s#^state = .*#state = \"$WORK/containerd-state\"#" \
         -e "s#address = \"/run/containerd/containerd.sock\"#address = \"$SOCK\"#" \
         -e 's#bin_dir = "/opt/cni/bin"#bin_dir = "/usr/lib/cni"#' \
         -e "s#conf_dir = \"/etc/cni/net.d\"#conf_dir = \"$WORK/net.d\"#" \
         -e 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' \
         "$WORK/containerd.toml"
  # A bridge network so that the node reports NetworkReady; pipeline pods use host networking.
  cat >"$WORK/net.d/10-bridge.conflist" <<'EOF'
{"cniVersion":"0.4.0","name":"numastream-real","plugins":[{"type":"bridge","bridge":"nsrealbr0","isGateway":true,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.214.0.0/24"}]]}},{"type":"loopback"}]}
EOF
  containerd --config "$WORK/containerd.toml" >"$WORK/containerd.log" 2>&1 &
  echo $! >"$WORK/containerd.pid"
  for _ in $(seq 40); do ctr --address "$SOCK" version >/dev/null 2>&1 && break; sleep 0.25; done
  images

  cat >"$WORK/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false                # this host may be cgroup v1; 1.36 refuses v1 by default
cgroupDriver: cgroupfs             # no systemd; containerd 1.6 lacks the RuntimeConfig RPC
containerRuntimeEndpoint: unix://$SOCK
cpuManagerPolicy: static
reservedSystemCPUs: "0"            # the static policy needs a reservation
topologyManagerPolicy: restricted
topologyManagerScope: container
failSwapOn: false
address: $NODE_IP
port: 30250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 30248
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "100Mi"}
# The images were imported, not pulled (no registry is reachable): the kubelet must never
# garbage-collect them, whatever the host's disk usage (it removed the sandbox image at 85%).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  numa_view
  start_kubelet
  { k wait --for=create "node/$NODE" --timeout=45s && k wait --for=condition=Ready "node/$NODE" --timeout=45s; } >/dev/null ||
    { echo "real-node: the kubelet did not become Ready; see $WORK/kubelet.log" >&2; tail -20 "$WORK/kubelet.log" >&2; exit 1; }
  log "kubelet Ready as node $NODE ($NODE_IP), static CPU manager, Topology Manager restricted; its view: CPU 0 on NUMA node 0, CPU 1 on node 1 (numa_view)"

  # The node daemon on the host, as its DaemonSet pod would run it: facts for NFD's features.d and
  # the NIC-locality device plugin in this kubelet's device-plugin directory.
  bin/node-daemon --node-name "$NODE" --publish features-d --features-dir "$WORK/features.d" --sysfs-root "$WORK/sysroot" \
    --device-plugin-dir "$PLUGIN_DIR" --agent "$PWD/bin/numastream-agent" \
    --tokens-per-nic 4 --bench-rounds 1 >"$WORK/node-daemon.log" 2>&1 &
  echo $! >"$WORK/node-daemon.pid"
  for _ in $(seq 60); do
    [[ $(k get node "$NODE" -o jsonpath='{.status.allocatable}' | grep -Eo '"numastream.io/nic-nsreal[01]":"[1-9]' | wc -l) -eq 2 ]] && break
    sleep 1
  done
  log "allocatable: $(k get node "$NODE" -o jsonpath='{.status.allocatable}')"
  [[ $(k get node "$NODE" -o jsonpath='{.status.allocatable}' | grep -Eo '"numastream.io/nic-nsreal[01]":"[1-9]' | wc -l) -eq 2 ]] ||
    { echo "real-node: the device plugin did not register; see $WORK/node-daemon.log" >&2; tail -20 "$WORK/node-daemon.log" >&2; exit 1; }
}

down() {
  set +e
  if [[ -f "$KUBECONFIG" ]]; then
    k delete pods --all-namespaces --field-selector "spec.nodeName=$NODE" --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1
  fi
  for p in node-daemon kubelet; do
    [[ -f "$WORK/$p.pid" ]] && kill "$(cat "$WORK/$p.pid")" 2>/dev/null
  done
  sleep 1
  if [[ -S "$SOCK" ]]; then
    for t in $(ctr_ t ls -q 2>/dev/null); do ctr_ t kill -s SIGKILL "$t" >/dev/null 2>&1; done
    sleep 1
    for t in $(ctr_ t ls -q 2>/dev/null); do ctr_ t rm -f "$t" >/dev/null 2>&1; done
    ctr_ c ls -q 2>/dev/null | xargs -r ctr --address "$SOCK" -n k8s.io c rm >/dev/null 2>&1
  fi
  [[ -f "$WORK/containerd.pid" ]] && kill "$(cat "$WORK/containerd.pid")" 2>/dev/null
  sleep 1
  [[ -f "$KUBECONFIG" ]] && k delete node "$NODE" --wait=false >/dev/null 2>&1
  # The kubelet and containerd leave mounts and cgroups behind.
  grep -o " $WORK[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -f "$PLUGIN_DIR"/numastream-*.sock
  if [[ -f "$WORK/created-var-lib-kubelet" ]]; then rm -rf /var/lib/kubelet; fi
  ip link del "$LINK" 2>/dev/null
  ip link del nsrealbr0 2>/dev/null
  rm -rf "$WORK"
  log "real node down, cleaned up"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  topology-policy) topology_policy "$2" ;;
  check) why=$(why_not); [[ -z "$why" ]] || { echo "$why"; exit 1; } ;;
  *) echo "usage: $0 up|down|check|topology-policy POLICY" >&2; exit 2 ;;
esac
