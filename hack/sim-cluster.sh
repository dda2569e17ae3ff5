#!/usr/bin/env bash
# A simulated facility cluster, by hand, with no container engine and no kubelet:
#   etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok
# with kwok-managed nodes shaped like a beamline facility: detector nodes, 2-socket gateways whose
# 200G NIC sits on NUMA node 1, analysis nodes, all labelled as numastream's node daemon labels
# them (docs/node-labels.md) and advertising the NIC-locality resource.
# Binaries come from build-k8s-bins.sh (BIN_DIR). Everything listens on 127.0.0.1 only.
#
#   run-sim-cluster.sh up      start everything, wait until healthy, create nodes; prints KUBECONFIG
#   run-sim-cluster.sh smoke   (after up) schedule a Pod with a nodeSelector, wait for Running
#   run-sim-cluster.sh down    stop everything started by `up` (by recorded PID), keep logs
#   run-sim-cluster.sh test    up + smoke + down (exit non-zero on failure)
set -euo pipefail

BIN_DIR="${BIN_DIR:-$HOME/.cache/numastream/k8s-1.36.4-sim}"
SIM_DIR="${SIM_DIR:-/tmp/numastream-sim}"
# The paper's machines (updraft1/2, polaris1/2 -> lynxdtn) plus generic ones.
DETECTORS="${DETECTORS:-4}"
GATEWAYS="${GATEWAYS:-3}"
ANALYSIS="${ANALYSIS:-2}"
EXTRA_NODES="${EXTRA_NODES:-0}"   # more plain detector-shaped nodes (scale benchmark)
# The simulated nodes' lease: renewed every quarter of it, as a kubelet does (40 s: a kubelet's
# default; the scale benchmark takes a longer one to load the API server less).
NODE_LEASE_SECONDS="${NODE_LEASE_SECONDS:-40}"
ETCD_PORT="${ETCD_PORT:-23790}"      # etcd client port (peer = +1)
API_PORT="${API_PORT:-26443}"
KCM_PORT="${KCM_PORT:-30257}"
SCHED_PORT="${SCHED_PORT:-30259}"
KWOK_PORT="${KWOK_PORT:-30247}"
SERVICE_CIDR="${SERVICE_CIDR:-10.96.0.0/16}"
POD_CIDR="${POD_CIDR:-10.244.0.0/16}"
# Where the API server listens and what it advertises (the `kubernetes` Service's endpoint). The
# facility's real nodes (hack/facility.sh) reach it on their management bridge: API_BIND=0.0.0.0
# API_ADVERTISE=10.212.0.1.
API_BIND="${API_BIND:-127.0.0.1}"
API_ADVERTISE="${API_ADVERTISE:-127.0.0.1}"
export KUBECONFIG="$SIM_DIR/admin.kubeconfig"
KUBECTL="$BIN_DIR/kubectl"; [[ -x "$KUBECTL" ]] || KUBECTL=kubectl

log() { echo "[$(date +%H:%M:%S.%3N)] $*"; }
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }

wait_for() { # wait_for <seconds> <description> <command...>
  local t=$1 what=$2; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then log "TIMEOUT waiting for $what"; return 1; fi
    sleep 0.5
  done
  log "ready: $what"
}

pki() {
  local d="$SIM_DIR/pki"; mkdir -p "$d"; cd "$d"
  # Reuse the PKI unless it predates the facility's management address.
  [[ -f ca.crt ]] && grep -q "IP:10.212.0.1," apiserver.ext 2>/dev/null && { cd - >/dev/null; return; }
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
    -subj "/CN=sim-cluster-ca" 2>/dev/null
  cat >apiserver.ext <<EOF
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.212.0.1,IP:${SERVICE_CIDR%.0/*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt \
    -days 3650 -extfile apiserver.ext 2>/dev/null
  # One client identity for every component: CN=sim-admin in group system:masters.
  printf 'keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
  openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=sim-admin" 2>/dev/null
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt \
    -days 3650 -extfile client.ext 2>/dev/null
  # Service-account token signing key pair.
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  cd - >/dev/null
}

kubeconfig() {
  cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $SIM_DIR/pki/ca.crt
users:
- name: sim-admin
  user:
    client-certificate: $SIM_DIR/pki/admin.crt
    client-key: $SIM_DIR/pki/admin.key
contexts:
- name: sim
  context: {cluster: sim, user: sim-admin}
current-context: sim
EOF
}

start() { # start <name> <binary> <args...>  (background, log + pid in $SIM_DIR)
  local name=$1; shift
  "$@" >"$SIM_DIR/logs/$name.log" 2>&1 &
  echo $! >"$SIM_DIR/pids/$name"
  log "started $name (pid $!)"
}

healthz() { curl -fsk --max-time 2 "$1" -o /dev/null; }

up() {
  mkdir -p "$SIM_DIR/logs" "$SIM_DIR/pids"
  down >/dev/null 2>&1 || true   # idempotent: a previous run's leftovers go first
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl; do
    [[ -x "$BIN_DIR/$b" ]] || { echo "missing $BIN_DIR/$b (run make k8s-bins-sim)" >&2; exit 1; }
  done
  [[ -f "$BIN_DIR/kwok-stages.yaml" ]] || { echo "missing $BIN_DIR/kwok-stages.yaml" >&2; exit 1; }
  local t0=$SECONDS
  pki; kubeconfig
  local P="$SIM_DIR/pki" KC="$KUBECONFIG"

  start etcd "$BIN_DIR/etcd" --name sim --data-dir "$SIM_DIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "sim=http://127.0.0.1:$((ETCD_PORT + 1))" \
    --unsafe-no-fsync --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))
  wait_for 30 etcd healthz "http://127.0.0.1:$ETCD_PORT/health"

  # AUDIT_LOG=file: every write, one JSON line each (who made the scale benchmark's writes; with
  # the request's body for numastream's own resources and events).
  [ -z "${AUDIT_LOG:-}" ] || printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' 'omitStages: [RequestReceived]' \
    'rules:' '- level: Request' '  verbs: [create, update, patch, delete]' '  resources: [{group: numastream.io}, {group: events.k8s.io}]' \
    '- level: Metadata' '  verbs: [create, update, patch, delete]' '- level: None' >"$SIM_DIR/audit-policy.yaml"
  start kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$API_BIND" --advertise-address "$API_ADVERTISE" --secure-port "$API_PORT" \
    --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
    --client-ca-file "$P/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --kubelet-preferred-address-types InternalIP,Hostname ${AUDIT_LOG:+--audit-policy-file "$SIM_DIR/audit-policy.yaml" --audit-log-path "$AUDIT_LOG" --audit-log-format json}
  wait_for 60 kube-apiserver k get --raw /readyz

  start kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig "$KC" --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
    --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --use-service-account-credentials=false
  start kube-scheduler "$BIN_DIR/kube-scheduler" \
    --kubeconfig "$KC" --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false
  start kwok "$BIN_DIR/kwok" --kubeconfig "$KC" --config "$BIN_DIR/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds "$NODE_LEASE_SECONDS" --cidr "$POD_CIDR" --node-ip 127.0.0.1 \
    --server-address "127.0.0.1:$KWOK_PORT" \
    --tls-cert-file "$P/admin.crt" --tls-private-key-file "$P/admin.key"
  wait_for 60 kube-controller-manager healthz "https://127.0.0.1:$KCM_PORT/healthz"
  wait_for 60 kube-scheduler healthz "https://127.0.0.1:$SCHED_PORT/healthz"
  wait_for 60 "serviceaccount default/default" k get serviceaccount default -n default
  log "control plane up in $((SECONDS - t0))s"

  local nodes="$SIM_DIR/nodes.yaml" i; : >"$nodes"
  for n in updraft1 updraft2 polaris1 polaris2; do node $n 16 16 1 100000 >>"$nodes"; done
  node lynxdtn 16 16 1 200000 >>"$nodes"
  # The paper's machines as measured; the facility's detectors and gateways as they are run:
  # 2 CPUs reserved for the system.
  for ((i = 1; i <= DETECTORS; i++)); do node detector-$i 16 16 1 100000 2 >>"$nodes"; done
  for ((i = 1; i <= GATEWAYS; i++)); do node gateway-$i 16 16 1 200000 2 >>"$nodes"; done
  for ((i = 1; i <= ANALYSIS; i++)); do node analysis-$i 32 32 0 100000 >>"$nodes"; done
  for ((i = 1; i <= EXTRA_NODES; i++)); do node "node-$(printf %04d "$i")" 16 16 1 100000 >>"$nodes"; done
  local total=$((5 + DETECTORS + GATEWAYS + ANALYSIS + EXTRA_NODES))
  k apply -f "$nodes" >/dev/null
  wait_for 120 "$total nodes Ready" bash -c \
    "[[ \$('$KUBECTL' --kubeconfig '$KUBECONFIG' get nodes -l type=kwok --no-headers | grep -cw Ready) -ge $total ]]"
  log "cluster up with $total facility nodes in $((SECONDS - t0))s; export KUBECONFIG=$KUBECONFIG"
}

# node <name> <cpus numa0> <cpus numa1> <NIC numa node> <NIC Mbit/s> [reserved CPUs]: a kwok node
# labelled like numastream's node daemon labels a real one, with the NIC-locality resource
# allocatable. Reserved CPUs are what the kubelet keeps for the system (the static CPU manager
# requires some): allocatable is below capacity by that much, as on every real streaming node.
node() {
  local name=$1 c0=$2 c1=$3 nicnode=$4 speed=$5 cpus=$(($2 + $3)) reserved=${6:-0}
  cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    feature.node.kubernetes.io/memory-numa: "true"
    numastream.io/numa-nodes: "2"
    numastream.io/numa0-cpus: "$c0"
    numastream.io/numa1-cpus: "$c1"
    numastream.io/nic.ens1f0.numa-node: "$nicnode"
    numastream.io/nic.ens1f0.speed-mbit: "$speed"
    numastream.io/lz4-compress-mb-per-s: "440"
    numastream.io/lz4-decompress-mb-per-s: "1600"
status:
  allocatable: {cpu: "$((cpus - reserved))", memory: 512Gi, pods: "110", numastream.io/nic-ens1f0: "16"}
  capacity: {cpu: "$cpus", memory: 512Gi, pods: "110", numastream.io/nic-ens1f0: "16"}
EOF
}

smoke() {
  local t0=$SECONDS
  k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: smoke, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: gateway-1}
  containers:
  - name: c
    image: example.invalid/never-pulled:1
    resources:
      requests: {cpu: "2", memory: 1Gi, numastream.io/nic-ens1f0: "1"}
      limits: {cpu: "2", memory: 1Gi, numastream.io/nic-ens1f0: "1"}
EOF
  wait_for 60 "pod smoke Running" bash -c \
    "[[ \$('$KUBECTL' --kubeconfig '$KUBECONFIG' get pod smoke -o jsonpath='{.status.phase}') == Running ]]"
  k delete pod smoke --wait=false >/dev/null
  log "PASS: a Guaranteed pod with the NIC resource runs on gateway-1 ($((SECONDS - t0))s)"
}

down() {
  local n pid
  for n in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [[ -f "$SIM_DIR/pids/$n" ]] || continue
    pid=$(cat "$SIM_DIR/pids/$n")
    if kill -0 "$pid" 2>/dev/null; then
      # peak RSS of each component, for the record
      echo "$n pid $pid $(grep VmHWM /proc/"$pid"/status 2>/dev/null | tr -s ' ')"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$SIM_DIR/pids/$n"
  done
  rm -rf "$SIM_DIR/etcd-data"
  log "stopped (logs kept in $SIM_DIR/logs)"
}

case "${1:-test}" in
  up) up ;;
  smoke) smoke ;;
  down) down ;;
  test)
    trap down EXIT
    up
    smoke
    ;;
  *) echo "usage: $0 up|smoke|down|test" >&2; exit 2 ;;
esac
