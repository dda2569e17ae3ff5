#!/usr/bin/env bash
# `make bench-operator`: 200 simulated nodes, 100 StreamPipelines applied at once. Prints the time
# until all are Planned, the operator's reconciles per second and its peak memory. A benchmark,
# not a test: the figures go to docs/performance.md.
# PIPELINES, NODES: the scale; OBSERVE_EVERY: the observer's period (0s: off); TIMEOUT: seconds
# to wait for all Planned; PROFILE=file: a CPU profile of the operator's first PROFILE_SECONDS (30)
# after the apply (Go pprof; `go tool pprof -top bin/operator file`).
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_SIM_BIN=${K8S_SIM_BIN:-$HOME/.cache/numastream/k8s-1.36.4-sim}
SIM_DIR=${SIM_DIR:-/tmp/numastream-bench-sim}
PIPELINES=${PIPELINES:-100}
NODES=${NODES:-200}
OBSERVE_EVERY=${OBSERVE_EVERY:-0s}
TIMEOUT=${TIMEOUT:-120}
PROFILE=${PROFILE:-}
export KUBECONFIG=$SIM_DIR/admin.kubeconfig
KUBECTL="$K8S_SIM_BIN/kubectl"
work=$(mktemp -d /tmp/numastream-bench.XXXXXX)
op_pid=
cleanup() {
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null || true
  BIN_DIR=$K8S_SIM_BIN SIM_DIR=$SIM_DIR bash hack/sim-cluster.sh down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

DETECTORS=0 GATEWAYS=0 ANALYSIS=0 EXTRA_NODES=$NODES BIN_DIR=$K8S_SIM_BIN SIM_DIR=$SIM_DIR \
  bash hack/sim-cluster.sh up | grep 'cluster up'
"$KUBECTL" apply --server-side -f config/crd/bases >/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metrics_port=$(free_port)
pprof_port=$(free_port)
bin/operator --kubeconfig "$KUBECONFIG" --metrics-bind-address=127.0.0.1:$metrics_port \
  --health-probe-bind-address=0 --observe-every="$OBSERVE_EVERY" --pprof-bind-address=127.0.0.1:$pprof_port \
  >"$work/operator.log" 2>&1 &
op_pid=$!
sleep 2

# Pipeline i streams from node 2i+1 to gateway node 2i+2 (one stream, one connection).
python3 - "$PIPELINES" >"$work/pipelines.yaml" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    s, g = 2 * i + 1, 2 * i + 2
    print(f"""---
apiVersion: numastream.io/v1beta1
kind: StreamPipeline
metadata: {{name: bench-{i:03d}, namespace: default}}
spec:
  senders: [{{node: node-{s:04d}, source: {{synthetic: {{chunks: 1000}}}}}}]
  gateway: {{node: node-{g:04d}, network: {{nic: ens1f0}}}}
  connections: 1
  threads: {{compress: 2, decompress: 1}}""")
PY
prof_pid=
if [ -n "$PROFILE" ]; then
  curl -s -o "$PROFILE" "127.0.0.1:$pprof_port/debug/pprof/profile?seconds=${PROFILE_SECONDS:-30}" &
  prof_pid=$!
fi
start=$(date +%s.%N)
"$KUBECTL" apply -f "$work/pipelines.yaml" >/dev/null
applied=$(date +%s.%N)
deadline=$((SECONDS + TIMEOUT))
while true; do
  ((SECONDS < deadline)) || { [ -n "$prof_pid" ] && wait "$prof_pid"; echo "not all pipelines planned within $TIMEOUT s" >&2; "$KUBECTL" get streampipelines | grep -v True | head >&2; exit 1; }
  planned=$("$KUBECTL" get streampipelines -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Planned")].status}{"\n"}{end}' | grep -c True || true)
  [ "$planned" -ge "$PIPELINES" ] && break
  sleep 0.2
done
done_at=$(date +%s.%N)
[ -n "$prof_pid" ] && wait "$prof_pid"
reconciles=$(curl -s "127.0.0.1:$metrics_port/metrics" | awk '/^controller_runtime_reconcile_total\{controller="streampipeline"/ {s += $2} END {print s+0}')
hwm=$(awk '/VmHWM/ {print $2}' /proc/$op_pid/status)
python3 - "$start" "$applied" "$done_at" "$reconciles" "$hwm" "$PIPELINES" "$NODES" <<'PY'
import sys
start, applied, done, rec, hwm, n, nodes = map(float, sys.argv[1:])
print(f"nodes {nodes:.0f}, pipelines {n:.0f}")
print(f"kubectl apply of all pipelines: {applied - start:.2f} s")
print(f"all Planned after:              {done - start:.2f} s (target < 10 s)")
print(f"reconciles:                     {rec:.0f} ({rec / (done - start):.0f} per second until all planned)")
print(f"operator peak RSS:              {hwm / 1024:.0f} MiB")
PY
