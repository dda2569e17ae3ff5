#!/usr/bin/env bash
# `make demo`: the whole mission on one machine.
# The fallback of hack/demo-facility.sh for hosts that cannot run real kubelets (not root):
#  1. a simulated facility cluster (real etcd, kube-apiserver, scheduler, controller-manager; kwok
#     nodes shaped like detectors and 2-socket gateways, labelled as numastream's node daemon does);
#  2. the operator, applying the single-stream sample: it plans every stage, and the scheduler
#     places the pods;
#  3. the real C++ agents, run here on 127.0.0.1 with the exact configuration the operator rendered
#     into the ConfigMap (only the endpoint host and the metrics port are changed to run locally),
#     streaming a few GB of synthetic tomography projections, every chunk verified;
#  4. everything torn down.
# Set DEMO_CHUNKS to stream more or less (default 300 projections, ~3.3 GB).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_SIM_BIN=${K8S_SIM_BIN:-$HOME/.cache/numastream/k8s-1.36.4-sim}
SIM_DIR=${SIM_DIR:-/tmp/numastream-demo-sim}
CHUNKS=${DEMO_CHUNKS:-300}
AGENT=bin/numastream-agent
export KUBECONFIG=$SIM_DIR/admin.kubeconfig
KUBECTL="$K8S_SIM_BIN/kubectl"
work=$(mktemp -d /tmp/numastream-demo.XXXXXX)
op_pid= rx_pid= relay_pid=

say() { printf '\n== %s\n' "$*"; }
cleanup() {
  [ -n "$rx_pid" ] && kill "$rx_pid" 2>/dev/null || true
  [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null || true
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null || true
  BIN_DIR=$K8S_SIM_BIN SIM_DIR=$SIM_DIR bash hack/sim-cluster.sh down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# make demo runs this only where the facility in a box cannot run (DEMO_FALLBACK says why).
echo "mode: simulated cluster (kwok nodes) + real agents on 127.0.0.1, because ${DEMO_FALLBACK:-the facility in a box was not asked for}"
echo "      (as root on Linux, make demo runs the pipeline as real pods on the facility in a box)"
say "1/4 simulated facility cluster"
BIN_DIR=$K8S_SIM_BIN SIM_DIR=$SIM_DIR bash hack/sim-cluster.sh up | grep -E 'control plane up|cluster up' || {
  echo "the simulated cluster did not start; logs in $SIM_DIR/logs" >&2; exit 1; }
"$KUBECTL" get nodes -L numastream.io/numa-nodes -L numastream.io/nic.ens1f0.numa-node -L numastream.io/nic.ens1f0.speed-mbit \
  | sed -n '1p;/detector-1 \|gateway-1 /p'

say "2/4 operator + StreamPipeline (config/samples/single-stream.yaml, ${CHUNKS} chunks)"
"$KUBECTL" apply --server-side -f config/crd/bases >/dev/null
"$KUBECTL" wait --for condition=established --timeout=60s crd/streampipelines.numastream.io crd/storageroots.numastream.io >/dev/null
bin/operator --kubeconfig "$KUBECONFIG" --metrics-bind-address=0 --health-probe-bind-address=0 \
  --agent-image=numastream/agent:demo --observe-every=0s --storage-prefixes=/scratch >"$work/operator.log" 2>&1 &
op_pid=$!
"$KUBECTL" apply -f config/samples/storage-roots.yaml >/dev/null # the admin's: where pipelines may write
sed "s/chunks: 1000/chunks: $CHUNKS/" config/samples/single-stream.yaml | "$KUBECTL" apply -f - >/dev/null
ready=
for _ in $(seq 120); do
  ready=$("$KUBECTL" get streampipeline single-stream -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
  [ "$ready" = True ] && break
  sleep 0.5
done
if [ "$ready" != True ]; then
  echo "the pipeline did not become Ready within 60 s; operator log:" >&2
  tail -n 20 "$work/operator.log" >&2
  "$KUBECTL" get streampipeline single-stream -o yaml >&2 || true
  exit 1
fi
"$KUBECTL" get streampipelines
echo
bin/kubectl-numastream status single-stream
echo
"$KUBECTL" get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,QOS:.status.qosClass,PHASE:.status.phase,CONTAINERS:.spec.containers[*].name,CPUS:.spec.containers[*].resources.limits.cpu,NIC-TOKEN:.spec.containers[0].resources.limits.numastream\.io/nic-ens1f0'

say "3/4 the real agents, with the configuration the operator rendered"
"$KUBECTL" get configmap single-stream-agent -o jsonpath='{.data.sender-0\.json}' >"$work/sender.json"
"$KUBECTL" get configmap single-stream-agent -o jsonpath='{.data.gateway-0-relay\.json}' >"$work/relay.json"
"$KUBECTL" get configmap single-stream-agent -o jsonpath='{.data.gateway-0\.json}' >"$work/gateway.json"
port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["endpoint"].rsplit(":",1)[1])' "$work/relay.json")
echo "sender config (from ConfigMap single-stream-agent):"; sed "s/^/    /" "$work/sender.json" | head -30; echo
# The gateway pod's two containers as two processes: the receiving container relays over IPC to
# the decompressing container. Local substitutions only: the endpoint host (no cluster DNS here),
# the IPC socket's directory (the pod's emptyDir), the metrics ports (all agents share this host)
# and the file sink's directory (the pod mounts the gateway's directory at /data).
"$AGENT" receive --config "$work/gateway.json" --endpoint "ipc://$work/stream.sock" --metrics-listen 127.0.0.1:0 \
  --sink-path "$work/single-stream-{stream}.raw" >"$work/rx.json" 2>"$work/rx.err" &
rx_pid=$!
"$AGENT" receive --config "$work/relay.json" --endpoint "tcp://127.0.0.1:$port" --metrics-listen 127.0.0.1:0 \
  --sink-endpoint "ipc://$work/stream.sock" >"$work/relay-out.json" 2>"$work/relay.err" &
relay_pid=$!
sleep 0.3
set +e
"$AGENT" send --config "$work/sender.json" --endpoint "tcp://127.0.0.1:$port" --metrics-listen 127.0.0.1:0 \
  >"$work/tx.json" 2>"$work/tx.err"
tx_rc=$?
wait "$relay_pid"; relay_rc=$?; relay_pid=
wait "$rx_pid"; rx_rc=$?; rx_pid=
set -e
python3 - "$work/tx.json" "$work/rx.json" "$work/single-stream-0.raw" "$work/relay-out.json" <<'PY'
import json, os, sys
tx = json.load(open(sys.argv[1])); rx = json.load(open(sys.argv[2])); relay = json.load(open(sys.argv[4]))
def placement(s):
    by = {}
    for t in s["placement"]["threads"]:
        by.setdefault(t["stage"], set()).add(t["cpu"])
    return "  ".join(f'{k} x{sum(1 for t in s["placement"]["threads"] if t["stage"] == k)} on cpu {",".join(map(str, sorted(v)))}' for k, v in by.items())
print("sender   ", placement(tx))
print("gateway   receive container  ", placement(relay))
print("gateway   decompress container", placement(rx))
print(f'sent      {tx["chunks"]} chunks, {tx["raw_bytes"]/1e9:.2f} GB raw, {tx["wire_bytes"]/1e9:.2f} GB on the wire')
print(f'received  {rx["chunks"]} chunks verified, ratio {rx["ratio"]:.2f}:1, {rx["raw_gbps"]:.2f} Gbit/s raw ({rx["seconds"]:.2f} s on this 2-core machine)')
print(f'integrity lost {rx["lost"]}, corrupt {rx["corrupt"]}, duplicates {rx["duplicates"]}, complete {rx["complete"]}')
if os.path.exists(sys.argv[3]):
    print(f'file sink {os.path.getsize(sys.argv[3])/1e9:.2f} GB written in sequence order ({os.path.getsize(sys.argv[3])} bytes = {rx["raw_bytes"]} verified)')
if rx.get("error"): print("receiver error:", rx["error"])
if tx.get("error"): print("sender error:", tx["error"])
PY

say "4/4 teardown"
"$KUBECTL" delete streampipeline single-stream --wait=false >/dev/null
if [ "$tx_rc" -ne 0 ] || [ "$relay_rc" -ne 0 ] || [ "$rx_rc" -ne 0 ]; then
  echo "demo FAILED: sender exit $tx_rc, receiving container exit $relay_rc, decompressing container exit $rx_rc" >&2
  tail -5 "$work/tx.err" "$work/relay.err" "$work/rx.err" >&2
  exit 1
fi
echo "demo OK"
