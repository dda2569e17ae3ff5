#!/usr/bin/env bash
# `make bench-operator`: 200 simulated nodes, 100 StreamPipelines applied at once. Prints the time
# until all are Planned, the operator's reconciles per second and its peak memory. A benchmark,
# not a test: the figures go to docs/performance.md.
# PIPELINES, NODES: the scale; APPLIERS: how many `kubectl apply --server-side` share the
# pipelines (4); OPERATOR: the operator binary (bin/operator; another build's to compare);
# WORKERS: its --workers; OBSERVE_EVERY: the observer's period (0s: off); TIMEOUT: seconds to
# wait for all Planned; SETTLE: seconds after that in which reconciles are counted (30);
# PROFILE=file: a CPU profile of the operator's first PROFILE_SECONDS (30) after the apply (Go
# pprof; `go tool pprof -top bin/operator file`).
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
"${OPERATOR:-bin/operator}" ${WORKERS:+--workers="$WORKERS"} --kubeconfig "$KUBECONFIG" --metrics-bind-address=127.0.0.1:$metrics_port --metrics-secure=false \
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
# Applied as GitOps tools apply a directory: server-side, APPLIERS (4) at once.
appliers=${APPLIERS:-4}
python3 - "$work" "$appliers" <<'PY'
import sys
work, n = sys.argv[1], int(sys.argv[2])
docs = [d for d in open(f"{work}/pipelines.yaml").read().split("---\n") if d.strip()]
for k in range(n):
    open(f"{work}/part-{k}.yaml", "w").write("".join("---\n" + d for d in docs[k::n]))
PY
start=$(date +%s.%N)
pids=()
for ((k = 0; k < appliers; k++)); do
  "$KUBECTL" apply --server-side -f "$work/part-$k.yaml" >/dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
applied=$(date +%s.%N)
deadline=$((SECONDS + TIMEOUT))
while true; do
  ((SECONDS < deadline)) || { [ -n "$prof_pid" ] && wait "$prof_pid"; echo "not all pipelines planned within $TIMEOUT s" >&2; "$KUBECTL" get streampipelines | grep -v True | head >&2; exit 1; }
  planned=$("$KUBECTL" get streampipelines -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Planned")].status}{"\n"}{end}' | grep -c True || true)
  [ "$planned" -ge "$PIPELINES" ] && break
  sleep 1 # each look lists every pipeline: looking more often loads the API server it measures
done
done_at=$(date +%s.%N)
metric() { curl -s "127.0.0.1:$metrics_port/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s+0}'; }
reconciles=$(metric 'controller_runtime_reconcile_total{controller="streampipeline"')
[ -n "$prof_pid" ] && wait "$prof_pid"
# Then, once every pipeline has converged (Reconciling=False: its agents' pods ran and ended;
# at most 300 s), SETTLE seconds with nothing applied: a pipeline that reconciles itself in a
# loop shows here.
quiet_from=$SECONDS
while ((SECONDS - quiet_from < 300)); do
  converged=$("$KUBECTL" get streampipelines -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Reconciling")].status}{"\n"}{end}' | grep -c False || true)
  [ "$converged" -ge "$PIPELINES" ] && break
  sleep 2
done
drained=$((SECONDS - quiet_from))
before_settle=$(metric 'controller_runtime_reconcile_total{controller="streampipeline"')
sleep "${SETTLE:-30}"
after_settle=$(metric 'controller_runtime_reconcile_total{controller="streampipeline"')
observed=$(metric numastream_operator_observations_total)
hwm=$(awk '/VmHWM/ {print $2}' /proc/$op_pid/status)
python3 - "$start" "$applied" "$done_at" "$reconciles" "$hwm" "$PIPELINES" "$NODES" "$((after_settle - before_settle))" "${SETTLE:-30}" "$observed" "$drained" <<'PY'
import sys
start, applied, done, rec, hwm, n, nodes, settled, settle, observed, drained = map(float, sys.argv[1:])
print(f"nodes {nodes:.0f}, pipelines {n:.0f}")
print(f"kubectl apply of all pipelines: {applied - start:.2f} s")
print(f"all Planned after:              {done - start:.2f} s from the first apply, {done - applied:.2f} s after the last")
print(f"reconciles:                     {rec:.0f} ({rec / n:.1f} per pipeline, {rec / (done - start):.0f} per second until all planned)")
print(f"all converged:                  {drained:.0f} s after all Planned (300: not all)")
print(f"reconciles in the {settle:.0f} s after:   {settled:.0f} (nothing applied: a loop would show here)")
print(f"observer readings:              {observed:.0f}")
print(f"operator peak RSS:              {hwm / 1024:.0f} MiB")
PY
