#!/usr/bin/env bash
# `make bench-operator`: 200 simulated nodes, 100 StreamPipelines applied at once. Prints the time
# until all are Planned, the operator's reconciles per second and its peak memory. A benchmark,
# not a test: the figures go to docs/performance.md.
# PIPELINES, NODES: the scale; APPLIERS: how many `kubectl apply --server-side` share the
# pipelines (4); OPERATOR: the operator binary (bin/operator; another build's to compare);
# WORKERS: its --workers; OBSERVE_EVERY: the observer's period (0s: off); TIMEOUT: seconds to
# wait for all Planned; CONVERGE_S: seconds to wait after that for all to converge (300);
# SETTLE: seconds after that in which reconciles are counted (30);
# PROFILE=file: a CPU profile of the operator's first PROFILE_SECONDS (30) after the apply (Go
# pprof; `go tool pprof -top bin/operator file`); NODE_LEASE_SECONDS: the simulated nodes' lease
# (40, a kubelet's: 2000 nodes renew 200 a second; a longer one leaves the API server, which here
# shares the 2 cores, more of them for the operator).
# The operator's own cost is printed from its process and its client's request counters: CPU
# seconds and API writes per pipeline until all are Planned and until all converged, the writes a
# pipeline needs at least (the objects it owns and one status write), and its CPU and memory
# while nothing changes.
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

NODE_LEASE_SECONDS=${NODE_LEASE_SECONDS:-40} DETECTORS=0 GATEWAYS=0 ANALYSIS=0 EXTRA_NODES=$NODES BIN_DIR=$K8S_SIM_BIN SIM_DIR=$SIM_DIR \
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
# The operator's CPU seconds so far (user + system, from /proc) and its client's requests by method.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' /proc/$op_pid/stat; }
writes() { curl -s "127.0.0.1:$metrics_port/metrics" | awk 'index($0, "rest_client_requests_total{") == 1 && $0 ~ /method="(POST|PUT|PATCH|DELETE)"/ {s += $NF} END {print s+0}'; }
requests() { curl -s "127.0.0.1:$metrics_port/metrics" | awk 'index($0, "rest_client_requests_total{") == 1 {s += $NF} END {print s+0}'; }
# Every process's CPU seconds (the simulated control plane's and the operator's), to show who the
# 2 cores served while the pipelines were planned.
components() {
  local f pid
  for f in "$SIM_DIR"/pids/*; do
    pid=$(cat "$f")
    awk -v n="$(basename "$f")" -v hz="$(getconf CLK_TCK)" '{printf "%s=%.1f ", n, ($14 + $15) / hz}' /proc/$pid/stat 2>/dev/null || true
  done
  echo "operator=$(cpu_s)"
}
cpu0=$(cpu_s); writes0=$(writes); requests0=$(requests); components0=$(components)
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
cpu_planned=$(cpu_s); writes_planned=$(writes); requests_planned=$(requests); components_planned=$(components)
metric() { curl -s "127.0.0.1:$metrics_port/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s+0}'; }
reconciles=$(metric 'controller_runtime_reconcile_total{controller="streampipeline"')
[ -n "$prof_pid" ] && wait "$prof_pid"
# Then, once every pipeline has converged (Reconciling=False: its agents' pods ran and ended;
# at most CONVERGE_S), SETTLE seconds with nothing applied: a pipeline that reconciles itself in a
# loop shows here.
quiet_from=$SECONDS
while ((SECONDS - quiet_from < ${CONVERGE_S:-300})); do
  converged=$("$KUBECTL" get streampipelines -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Reconciling")].status}{"\n"}{end}' | grep -c False || true)
  [ "$converged" -ge "$PIPELINES" ] && break
  sleep 2
done
drained=$((SECONDS - quiet_from))
cpu_converged=$(cpu_s); writes_converged=$(writes); requests_converged=$(requests)
before_settle=$(metric 'controller_runtime_reconcile_total{controller="streampipeline"')
sleep "${SETTLE:-30}"
after_settle=$(metric 'controller_runtime_reconcile_total{controller="streampipeline"')
cpu_settled=$(cpu_s); writes_settled=$(writes)
rss=$(awk '/VmRSS/ {print $2}' /proc/$op_pid/status)
# What the pipelines own (by their label), of the kinds the operator writes.
owned=0
for kind in jobs configmaps services networkpolicies persistentvolumeclaims persistentvolumes secrets serviceaccounts roles rolebindings; do
  n=$("$KUBECTL" get "$kind" -A -l numastream.io/pipeline --no-headers 2>/dev/null | wc -l)
  owned=$((owned + n))
done
observed=$(metric numastream_operator_observations_total)
hwm=$(awk '/VmHWM/ {print $2}' /proc/$op_pid/status)
python3 - "$start" "$applied" "$done_at" "$reconciles" "$hwm" "$PIPELINES" "$NODES" "$((after_settle - before_settle))" "${SETTLE:-30}" "$observed" "$drained" \
  "$cpu0" "$cpu_planned" "$cpu_converged" "$cpu_settled" "$writes0" "$writes_planned" "$writes_converged" "$writes_settled" \
  "$requests0" "$requests_planned" "$requests_converged" "$owned" "$rss" "${NODE_LEASE_SECONDS:-40}" "${CONVERGE_S:-300}" \
  "$components0" "$components_planned" <<'PY'
import sys
c0, c1 = ({k: float(v) for k, v in (kv.split("=") for kv in a.split())} for a in sys.argv[-2:])
del sys.argv[-2:]
(start, applied, done, rec, hwm, n, nodes, settled, settle, observed, drained, cpu0, cpu_planned, cpu_converged, cpu_settled,
 w0, w_planned, w_converged, w_settled, r0, r_planned, r_converged, owned, rss, lease, converge) = map(float, sys.argv[1:])
print(f"nodes {nodes:.0f}, pipelines {n:.0f}")
print(f"kubectl apply of all pipelines: {applied - start:.2f} s")
print(f"all Planned after:              {done - start:.2f} s from the first apply, {done - applied:.2f} s after the last")
print(f"reconciles:                     {rec:.0f} ({rec / n:.1f} per pipeline, {rec / (done - start):.0f} per second until all planned)")
print(f"all converged:                  {drained:.0f} s after all Planned ({converge:.0f}: not all)")
print(f"reconciles in the {settle:.0f} s after:   {settled:.0f} (nothing applied: a loop would show here)")
print(f"observer readings:              {observed:.0f}")
print(f"operator peak RSS:              {hwm / 1024:.0f} MiB")
need = owned / n + 1
print(f"simulated nodes' lease:         {lease:.0f} s (renewed every {lease / 4:.0f} s: {nodes / (lease / 4):.0f} writes/s by the nodes)")
print(f"operator CPU until all Planned: {cpu_planned - cpu0:.1f} s ({(cpu_planned - cpu0) / n * 1000:.1f} ms per pipeline); "
      f"until converged: {cpu_converged - cpu0:.1f} s ({(cpu_converged - cpu0) / n * 1000:.1f} ms per pipeline)")
used = {k: c1[k] - c0.get(k, 0) for k in c1}
print(f"CPU until all Planned:          " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(used.items(), key=lambda kv: -kv[1])) +
      f" ({sum(used.values()) / (done - start) * 100:.0f}% of a core on average)")
print(f"operator requests per pipeline: {(r_planned - r0) / n:.1f} until all Planned, {(r_converged - r0) / n:.1f} until converged")
print(f"operator writes per pipeline:   {(w_planned - w0) / n:.1f} until all Planned, {(w_converged - w0) / n:.1f} until converged; "
      f"at least {need:.1f} ({owned / n:.1f} owned objects + 1 status write): {(w_planned - w0) / n / need:.2f}x and {(w_converged - w0) / n / need:.2f}x")
steady = "steady" if drained < converge else "not all converged yet"
print(f"{steady}, the {settle:.0f} s after:       {(cpu_settled - cpu_converged) / settle * 100:.1f}% of a core, {w_settled - w_converged:.0f} writes, "
      f"RSS {rss / 1024:.0f} MiB")
PY
