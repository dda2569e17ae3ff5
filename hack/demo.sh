#!/usr/bin/env bash
# `make demo`, today: two real agents on 127.0.0.1 stream synthetic tomography projections
# (16-bit, 2560x2160, 11,059,200 bytes each) through LZ4 and two TCP connections; the receiver
# decompresses and verifies every chunk. Prints placement, throughput, ratio and integrity.
# The simulated facility cluster (operator + StreamPipeline) joins this demo as it lands.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENT=bin/numastream-agent
CHUNKS=${DEMO_CHUNKS:-300}
CONNECTIONS=${DEMO_CONNECTIONS:-2}
work=$(mktemp -d /tmp/numastream-demo.XXXXXX)
rx_pid=
cleanup() {
  [ -n "$rx_pid" ] && kill "$rx_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
port=$(( port > 60000 ? port - 1000 : port ))
endpoint="tcp://127.0.0.1:${port}"

echo "== numastream demo: verified loopback stream between two agents"
echo "   $CHUNKS synthetic projections (~$(( CHUNKS * 11 / 1000 )) GB raw), LZ4, $CONNECTIONS TCP connections, $endpoint"
echo
"$AGENT" receive --endpoint "$endpoint" --connections "$CONNECTIONS" --streams 1 \
  --metrics-listen 127.0.0.1:0 >"$work/rx.json" 2>"$work/rx.err" &
rx_pid=$!
sleep 0.3
set +e
"$AGENT" send --endpoint "$endpoint" --connections "$CONNECTIONS" --chunks "$CHUNKS" \
  >"$work/tx.json" 2>"$work/tx.err"
tx_rc=$?
wait "$rx_pid"
rx_rc=$?
rx_pid=
set -e

python3 - "$work/tx.json" "$work/rx.json" <<'PY'
import json, sys
tx = json.load(open(sys.argv[1]))
rx = json.load(open(sys.argv[2]))
def placement(s):
    by = {}
    for t in s["placement"]["threads"]:
        by.setdefault(t["stage"], []).append(f'cpu{t["cpu"]}/node{t["numa_node"]}')
    return "  ".join(f'{k}: {", ".join(v)}' for k, v in by.items())
print("sender   placement ", placement(tx))
print("receiver placement ", placement(rx))
for w in tx["placement"]["warnings"] + rx["placement"]["warnings"]:
    print("         note      ", w)
print()
print(f'sent      {tx["chunks"]} chunks, {tx["raw_bytes"]/1e9:.2f} GB raw, {tx["wire_bytes"]/1e9:.2f} GB on the wire')
print(f'received  {rx["chunks"]} chunks verified (XXH3 per chunk), ratio {rx["ratio"]:.2f}:1')
print(f'rate      {rx["raw_gbps"]:.2f} Gbit/s raw, {rx["wire_gbps"]:.2f} Gbit/s on the wire ({rx["seconds"]:.2f} s)')
print(f'integrity lost {rx["lost"]}, corrupt {rx["corrupt"]}, duplicates {rx["duplicates"]}, malformed {rx["malformed"]}, complete {rx["complete"]}')
st = rx["stages"]
print("receiver stages (thread-seconds busy / waiting for input / waiting for output):")
for name, s in st.items():
    print(f'          {name:<10} {s["busy_s"]:6.2f} / {s["blocked_input_s"]:6.2f} / {s["blocked_output_s"]:6.2f}')
PY
if [ "$tx_rc" -ne 0 ] || [ "$rx_rc" -ne 0 ]; then
  echo "demo FAILED: sender exit $tx_rc, receiver exit $rx_rc" >&2
  cat "$work/tx.err" "$work/rx.err" >&2
  exit 1
fi
echo
echo "demo OK"
