#!/usr/bin/env bash
# `make demo` on the facility in a box (root): the whole mission as real pods.
#  1. the control plane and four real kubelet nodes, detector-a, detector-b, gateway-a and gw-numa
#     (whose kubelet sees two NUMA nodes), joined by a 1 Gbit/s shaped facility link
#     (hack/facility.sh);
#  2. numastream installed with its Helm chart: the node daemon measures each node and publishes
#     NodeFeatures, nfd-master turns them into the labels the operator plans with;
#  3. a StreamPipeline (test/facility/pipeline.yaml, its gateway gw-numa) applied with kubectl:
#     the operator plans the receiving stage on the NUMA node of gw-numa's data NIC (fab0, node 1),
#     the kubelet's Topology Manager gives the receiving container that node's CPU, the sender
#     joins the data network (Multus) and dials the gateway's address there; every chunk is
#     verified at the gateway and written to a file; `kubectl numastream status` shows the plan
#     beside the CPU and NUMA node each agent's threads report;
#  4. the figures, from the agents and the link: chunks, integrity, rates against the plan, and the
#     link's byte counters against the stream's wire bytes;
#  5. the field's codec and files: a second pipeline (test/facility/pipeline-hdf5.yaml) compresses
#     with bitshuffle + LZ4 and the gateway stores the frames as they arrive in an HDF5 file,
#     written past the page cache (io: direct, its log says so), which h5dump (Debian's) and h5py
#     + hdf5plugin (tools we did not write) read back, checked against the source frames;
#  6. detector data as beamlines produce it: a simulated EIGER2 (numastream-agent detector-sim in a
#     pod on detector-a, test/facility/detector-sim.yaml, armed for a rotation: omega from 0 by
#     0.1 degree per image) publishes two Stream V2 series; a third pipeline
#     (test/facility/pipeline-fanout.yaml) carries its messages byte for byte across the link,
#     and gateway-a hands each to three consumers at once: NXmx master and data files of 10
#     images per series (the images as the detector compressed them, checked with h5py against
#     the simulator's pixels and imported by DIALS: one sweep, its oscillation), a file of the
#     messages as they came, and an onward hop to a far site (a receiver on the box's host,
#     described by a RemoteSite, test/facility/remotesite-hpc.yaml), whose copy is compared with
#     the facility's byte for byte; its live preview is opened with kubectl numastream preview
#     and saved by headless chromium as build/demo/preview.png;
#  7. everything torn down, and checked gone.
# Set DEMO_CHUNKS to stream more or less (default 300 projections, ~3.3 GB raw).
set -euo pipefail
cd "$(dirname "$0")/.."

SIM_BIN=${SIM_BIN:-$HOME/.cache/numastream/k8s-1.36.4-sim}
SIM_DIR=${SIM_DIR:-/tmp/numastream-demo-sim}
CHUNKS=${DEMO_CHUNKS:-300}
SINK=/var/tmp/numastream-demo
export KUBECONFIG=$SIM_DIR/admin.kubeconfig SIM_DIR
KUBECTL="$SIM_BIN/kubectl"
k() { "$KUBECTL" "$@"; }
fac() { bash hack/facility.sh "$@"; }
say() { printf '\n== %s\n' "$*"; }
started=$(date +%s)

cleanup() {
  kill $(jobs -p) 2>/dev/null || true # the far site's receiver, a preview's port-forward
  fac down >/dev/null 2>&1 || true
  BIN_DIR=$SIM_BIN bash hack/sim-cluster.sh down >/dev/null 2>&1 || true
  rm -rf "$SINK"
}
trap cleanup EXIT

echo "mode: the facility in a box: real kubelets, containerd, Multus, NFD; the pipeline runs as real pods"
say "1/7 control plane + detector-a, detector-b, gateway-a and gw-numa (real kubelets) + facility link"
API_BIND=0.0.0.0 API_ADVERTISE=10.212.0.1 BIN_DIR=$SIM_BIN bash hack/sim-cluster.sh up >"$SIM_DIR.log" 2>&1 ||
  { tail -20 "$SIM_DIR.log"; exit 1; }
fac up | grep -E '^\[' | grep -vE 'images|kubeconfig' || true

say "2/7 helm install numastream (operator + node daemon), labels from NFD"
fac install
# gw-numa's receiving container asks for a NIC-locality token of fab0: wait until its node daemon's
# device plugin has advertised them (the scheduler would hold the pod until then).
for _ in $(seq 120); do
  [ -n "$(k get node gw-numa -o jsonpath='{.status.allocatable.numastream\.io/nic-fab0}')" ] && break
  sleep 0.5
done
k get nodes -l numastream.io/facility=box -L numastream.io/numa-nodes -L numastream.io/nic.fab0.speed-mbit -L numastream.io/nic.fab0.numa-node \
  -L numastream.io/lz4-compress-mb-per-s -L numastream.io/bslz4-compress-mb-per-s -L numastream.io/bslz4-decompress-mb-per-s
k -n numastream-system get pods -o wide | awk '{print $1, $3, $7}' | column -t

say "3/7 kubectl apply -f test/facility/pipeline.yaml onto gw-numa (two NUMA nodes, fab0 on node 1; ${CHUNKS} chunks)"
# The admin's part: a directory the agents' user may write, and the StorageRoot that lets
# pipelines use it (the pipelines name it and a path under it).
mkdir -p "$SINK" && chown 65532:65532 "$SINK"
sed -e "s|/var/tmp/numastream-facility|$SINK|" test/facility/storage-root.yaml | k apply -f - >/dev/null
sed -e "s/chunks: 150/chunks: $CHUNKS/" -e "s/node: gateway-a/node: gw-numa/" test/facility/pipeline.yaml |
  k apply -f - >/dev/null
for _ in $(seq 120); do
  [ -n "$(k get streampipeline facility -o jsonpath='{.status.plan}' 2>/dev/null)" ] && break
  sleep 0.5
done
bin/kubectl-numastream status facility
rx0=$(fac link-bytes | awk '$1=="gw-numa" {print $4}')
reason=
for _ in $(seq 360); do
  reason=$(k get streampipeline facility -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}')
  [ "$reason" = Completed ] && [ "$(k get streampipeline facility -o jsonpath='{.status.observed.chunksDelivered}')" = "$CHUNKS" ] && break
  sleep 0.5
done
rx1=$(fac link-bytes | awk '$1=="gw-numa" {print $4}')
k get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,QOS:.status.qosClass,CONTAINERS:.spec.containers[*].name,CPUS:.spec.containers[*].resources.limits.cpu,POD-IP:.status.podIP'
gw=$(k get pods -l numastream.io/role=gateway -o jsonpath='{.items[0].metadata.name}')
tx=$(k get pods -l numastream.io/role=sender -o jsonpath='{.items[0].metadata.name}')
echo "gateway $gw network-status (Multus):"
k get pod "$gw" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' |
  python3 -c '
import json, sys
for n in json.load(sys.stdin):
    print("    %-5s %-14s %s" % (n["interface"], ",".join(n["ips"]), n["name"]))'
if [ "$reason" != Completed ]; then
  echo "the pipeline did not complete within 180 s (Ready reason: ${reason:-none})" >&2
  k get streampipeline facility -o yaml >&2
  k -n numastream-system logs deploy/numastream-operator --tail=20 >&2 || true
  exit 1
fi

say "4/7 what the agents and the link report"
k logs "$tx" -c agent | grep '^{' | tail -1 >"$SINK/tx.json"
k logs "$gw" -c decompress | grep '^{' | tail -1 >"$SINK/rx.json"
k get streampipeline facility -o json >"$SINK/sp.json"
python3 - "$SINK" "$((rx1 - rx0))" <<'PY'
import glob, json, os, sys
d, link_rx = sys.argv[1], int(sys.argv[2])
tx = json.load(open(f"{d}/tx.json")); rx = json.load(open(f"{d}/rx.json")); st = json.load(open(f"{d}/sp.json"))["status"]
obs = st["observed"]
print(f'sender    dialled {tx["endpoint"]} (the gateway on the data network); {tx["chunks"]} chunks, '
      f'{tx["raw_bytes"]/1e9:.2f} GB raw, {tx["wire_bytes"]/1e9:.2f} GB on the wire (ratio {tx["raw_bytes"]/tx["wire_bytes"]:.2f}:1)')
print(f'gateway   {rx["chunks"]} chunks verified; lost {rx["lost"]}, corrupt {rx["corrupt"]}, duplicates {rx["duplicates"]}, '
      f'complete {rx["complete"]}; {rx["seconds"]:.2f} s')
print(f'link      fab0 on gw-numa received {link_rx} bytes; the stream put {rx["wire_bytes"]} bytes on the wire '
      f'({link_rx / rx["wire_bytes"]:.3f}x: the data crossed the facility link)')
print(f'status    Ready Completed; observed {obs["rawGbps"]} Gbit/s raw, {obs["wireGbps"]} Gbit/s wire; '
      f'{obs["chunksDelivered"]} delivered, {obs["chunksLost"]} lost, {obs["chunksCorrupt"]} corrupt; NIC-local {obs.get("nicLocal")}')
pred, got = float(st["predictedGbps"]), float(obs["rawGbps"])
print(f'plan      predicted {pred:.2f} Gbit/s raw, bottleneck {st["bottleneck"]}; observed {got:.2f} ({100*got/pred:.0f}% of the prediction)')
for f in sorted(glob.glob(f"{d}/run-1/facility-*.raw")):
    size = os.path.getsize(f)
    print(f'file      {f}: {size} bytes ({"complete" if size == rx["raw_bytes"] else "INCOMPLETE"})')
ok = rx["lost"] == 0 and rx["corrupt"] == 0 and rx["complete"] and link_rx >= rx["wire_bytes"]
sys.exit(0 if ok else 1)
PY
echo "kubectl numastream status facility: where the agents run, against the plan"
bin/kubectl-numastream status facility | sed -n '/^placement/,/^observed/p'
k get streampipelines

say "5/7 kubectl apply -f test/facility/pipeline-hdf5.yaml: bslz4 frames into an HDF5 file"
k delete streampipeline facility --wait=true --timeout=60s >/dev/null
k apply -f test/facility/pipeline-hdf5.yaml >/dev/null
reason=
for _ in $(seq 240); do
  reason=$(k get streampipeline facility-hdf5 -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}')
  [ "$reason" = Completed ] && break
  sleep 0.5
done
if [ "$reason" != Completed ]; then
  echo "the HDF5 pipeline did not complete within 120 s (Ready reason: ${reason:-none})" >&2
  k get streampipeline facility-hdf5 -o yaml >&2
  exit 1
fi
k get streampipeline facility-hdf5 -o json >"$SINK/sp-hdf5.json"
python3 - "$SINK/sp-hdf5.json" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))["status"]
o = st["observed"]
print(f"status    Ready Completed; {o['chunksDelivered']} delivered, {o['chunksLost']} lost, {o['chunksCorrupt']} corrupt; "
      f"observed {o['rawGbps']} Gbit/s raw, {o['wireGbps']} Gbit/s on the wire; predicted {st['predictedGbps']}, "
      f"bottleneck {st['bottleneck']}")
PY
gw=$(k get pods -l numastream.io/pipeline=facility-hdf5,numastream.io/role=gateway -o jsonpath='{.items[0].metadata.name}')
opened=$(k logs "$gw" -c decompress | grep -F 'hdf5 sink: ' || true)
if ! grep -qF '(direct I/O: past the page cache)' <<<"$opened"; then
  echo "the gateway did not write past the page cache (spec.sink.hdf5.io: direct); its log says:" >&2
  echo "${opened:-(no hdf5 sink line)}" >&2
  exit 1
fi
sed -E 's/^[^ ]+ [A-Z]+ numastream-agent: /gateway   /' <<<"$opened"
echo "h5dump -H $SINK/hdf5/scan-0.h5:"
h5dump -H "$SINK/hdf5/scan-0.h5" | sed 's/^/    /'
bin/numastream-agent synth --out "$SINK/source.raw" --chunk-bytes 11059200 --frames 4 --seed 7
"$(bash hack/pyenv.sh)" - "$SINK" <<'PY'
import os, subprocess, sys
import h5py, hdf5plugin, numpy as np
d = sys.argv[1]
src = np.fromfile(f"{d}/source.raw", dtype="<u2").reshape(4, 2160, 2560)
with h5py.File(f"{d}/hdf5/scan-0.h5", "r") as f:
    ds = f["/exchange/data"]
    bad = [i for i in range(ds.shape[0]) if not np.array_equal(ds[i], src[i % 4])]
    stored = sum(ds.id.get_chunk_info(i).size for i in range(ds.id.get_num_chunks()))
    print(f"h5py      /exchange/data {ds.shape} {ds.dtype}, filters {dict(ds._filters)}: "
          f"{ds.shape[0] - len(bad)} of {ds.shape[0]} frames equal to the source; "
          f"{stored / 1e6:.1f} MB stored for {ds.shape[0] * src[0].nbytes / 1e6:.1f} MB of pixels")
env = dict(os.environ, HDF5_PLUGIN_PATH=hdf5plugin.PLUGIN_PATH)
out = subprocess.run(["h5dump", "-d", "/exchange/data", "-s", "59,1080,1280", "-c", "1,1,4", "-w", "0", f"{d}/hdf5/scan-0.h5"],
                     capture_output=True, text=True, env=env, check=True).stdout
line = [l.strip() for l in out.splitlines() if l.strip().startswith("(59,1080,1280)")][0]
print(f"h5dump    frame 59, row 1080, pixels 1280-1283: {line.split(':', 1)[1].strip()} "
      f"(source: {', '.join(str(v) for v in src[59 % 4][1080][1280:1284])})")
sys.exit(1 if bad or ds.shape[0] != 60 else 0)
PY

say "6/7 a detector's rotation series to NXmx files, a file of its messages, a far site and the live preview (test/facility/detector-sim.yaml, pipeline-fanout.yaml)"
k delete streampipeline facility-hdf5 --wait=true --timeout=60s >/dev/null
sed -e 's|--seed, "7",|--seed, "7", --goniometer, "omega=0,0.1",|' test/facility/detector-sim.yaml | k apply -f - >/dev/null
ip=
for _ in $(seq 120); do
  ip=$(k get pod eiger-sim -o jsonpath='{.status.podIP}' 2>/dev/null || true)
  [ -n "$ip" ] && break
  sleep 0.5
done
if [ -z "$ip" ]; then
  echo "the detector pod got no address within 60 s" >&2
  k describe pod eiger-sim >&2
  exit 1
fi
echo "detector  eiger-sim on detector-a, Stream V2 at tcp://$ip:31001: 2 rotation series of 40 images (omega 0 + 0.1 deg per image), 514x1030 uint16, 2 thresholds, bslz4"
# The far site: a plain receiver on the box's host with a key pair of its own, described to the
# cluster by a RemoteSite; it admits the gateway keys the RemoteSite's status lists.
hpc=$SINK/hpc
mkdir -p "$hpc"
bin/numastream-agent keygen --out "$hpc/far" >/dev/null
far_key=$(sed 's/[&\\]/\\&/g' "$hpc/far.public") # Z85 has & (sed's "what matched")
sed -e "s|FAR_KEY|$far_key|" test/facility/remotesite-hpc.yaml | k apply -f - >/dev/null
sed -e "s/DETECTOR_IP/$ip/" test/facility/pipeline-fanout.yaml | k apply -f - >/dev/null
for _ in $(seq 120); do
  [ -n "$(k get remotesite hpc -o jsonpath='{.status.admittedKeys}' 2>/dev/null)" ] &&
    [ -n "$(k get streampipeline facility-stream2 -o jsonpath='{.status.plan.onward}' 2>/dev/null)" ] && break
  sleep 0.5
done
bin/kubectl-numastream site-keys hpc >"$hpc/allowed"
if ! [ -s "$hpc/allowed" ]; then
  echo "RemoteSite hpc lists no gateway key within 60 s" >&2
  k get remotesite hpc -o yaml >&2
  exit 1
fi
bin/numastream-agent receive --endpoint tcp://10.212.0.1:7000 \
  --connections "$(k get streampipeline facility-stream2 -o jsonpath='{.status.plan.onward[0].connections}')" \
  --sink file --sink-path "$hpc/there-{stream}.raw" --idle-timeout 300 \
  --set security.curve.secret_key_file="$hpc/far.secret" --set security.curve.allowed_keys_file="$hpc/allowed" \
  >"$hpc/receive.json" 2>"$hpc/receive.log" &
far_pid=$!
echo "far site  numastream-agent receive on the host, tcp://10.212.0.1:7000 (RemoteSite hpc), admitting the gateway key the RemoteSite lists"
bin/kubectl-numastream status facility-stream2
for _ in $(seq 360); do
  [ -f "$SINK/nxmx/eiger-1_data_000004.h5" ] && [ -f "$SINK/nxmx/eiger-2_data_000004.h5" ] && break
  sleep 0.5
done
tx=$(k get pods -l numastream.io/pipeline=facility-stream2,numastream.io/role=sender -o jsonpath='{.items[0].metadata.name}')
gw=$(k get pods -l numastream.io/pipeline=facility-stream2,numastream.io/role=gateway -o jsonpath='{.items[0].metadata.name}')
k logs "$tx" -c agent | grep -E 'stream2: (series|the detector)' | sed -E 's/^[^ ]+ [A-Z]+ numastream-agent: /sender    /'
k logs "$gw" -c decompress | grep -E 'hdf5 sink: series' | sed -E 's/^[^ ]+ [A-Z]+ numastream-agent: /gateway   /'
if ! [ -f "$SINK/nxmx/eiger-1_data_000004.h5" ] || ! [ -f "$SINK/nxmx/eiger-2_data_000004.h5" ]; then
  echo "the two series' data files did not all appear within 180 s" >&2
  ls -laR "$SINK" >&2
  k get streampipeline facility-stream2 -o yaml >&2
  exit 1
fi
# The live preview, as the people at the experiment see it: kubectl numastream preview forwards a
# local port to the gateway, and headless chromium (Debian's) saves the page.
bin/kubectl-numastream preview facility-stream2 --port 18090 >"$SINK/preview.log" 2>&1 &
preview_pid=$!
mkdir -p build/demo
shot=$PWD/build/demo/preview.png # kept after the demo
rm -f "$shot"
for _ in $(seq 60); do
  curl -fsS -o /dev/null http://127.0.0.1:18090/preview 2>/dev/null && break
  sleep 0.5
done
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=640,480 \
  --virtual-time-budget=4000 --user-data-dir="$SINK/chromium" --screenshot="$shot" \
  http://127.0.0.1:18090/preview >/dev/null 2>&1 || true
kill $preview_pid 2>/dev/null || true
if ! [ -s "$shot" ]; then
  echo "headless chromium saved no picture of the live preview; kubectl numastream preview said:" >&2
  cat "$SINK/preview.log" >&2
  exit 1
fi
echo "preview   headless chromium saved the gateway's live view: $shot ($(python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(24); print("%dx%d" % struct.unpack(">II", d[16:24]))' "$shot") PNG)"
# The operator reads the agents at its own interval: wait for the reading after the last message
# (2 series of a start, 40 images and an end).
for _ in $(seq 60); do
  [ "$(k get streampipeline facility-stream2 -o jsonpath='{.status.observed.chunksDelivered}')" = 84 ] && break
  sleep 0.5
done
k get streampipeline facility-stream2 -o json >"$SINK/sp-stream2.json"
python3 - "$SINK/sp-stream2.json" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))["status"]
o = st.get("observed", {})
print(f"status    {o.get('chunksDelivered')} messages delivered, {o.get('chunksLost')} lost, {o.get('chunksCorrupt')} corrupt, "
      f"{o.get('seriesIncomplete', 0)} series incomplete; predicted {st['predictedGbps']} Gbit/s, bottleneck {st['bottleneck']}")
PY
bin/numastream-agent synth --out "$SINK/eiger-src.raw" --chunk-bytes $((514 * 1030 * 2)) --width 1030 --frames 45 --seed 7
"$(bash hack/pyenv.sh)" - "$SINK" <<'PY'
import sys, time
import h5py, hdf5plugin, numpy as np
d = sys.argv[1]
src = np.fromfile(f"{d}/eiger-src.raw", dtype="<u2").reshape(45, 514, 1030)
bad = 0
for s in (1, 2):
    master = f"{d}/nxmx/eiger-{s}_master.h5"
    for _ in range(100):  # the master takes end_time once the series is complete
        with h5py.File(master, "r") as f:
            if "end_time" in f["/entry"]:
                break
        time.sleep(0.2)
    with h5py.File(master, "r") as f:
        for c, name in enumerate(("threshold_1", "threshold_2")):
            ds = f[f"/entry/data/{name}"]
            wrong = [i for i in range(ds.shape[0]) if not np.array_equal(ds[i], src[i + 5 * c])]
            bad += len(wrong) + (ds.shape[0] != 40)
            print(f"h5py      eiger-{s}_master.h5 /entry/data/{name} {ds.shape} {ds.dtype} over "
                  f"{len([k for k in f['/entry/data'] if k.startswith(name + '_')])} data files: "
                  f"{ds.shape[0] - len(wrong)} of 40 images equal to the detector's pixels")
        omega = f["/entry/sample/transformations/omega"][()]
        print(f"          series {int(f['/entry'].attrs['series_id'])}: omega {omega[0]:.1f} to {omega[-1]:.1f} deg, "
              f"{f['/entry/end_time'][()].decode()} end time")
sys.exit(1 if bad else 0)
PY
if command -v dials.import >/dev/null; then
  dials_dir=$(mktemp -d)
  (cd "$dials_dir" && dials.import "$SINK/nxmx/eiger-1_master.h5" >dials.out 2>&1) || { cat "$dials_dir/dials.out" >&2; exit 1; }
  /usr/bin/python3 test/codec/dials_probe.py "$dials_dir/imported.expt" >"$dials_dir/probe.json"
  python3 - "$dials_dir/probe.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["imagesets"][0]
print(f"DIALS     dials.import eiger-1_master.h5: one {s['kind']} of {s['images']} images {s['image_range']}, "
      f"oscillation {s['oscillation'][0]:.1f} + {s['oscillation'][1]:.2f} deg per image, wavelength "
      f"{s['wavelength']:.3f} A, distance {s['distance_mm']:.1f} mm, beam centre "
      f"({s['beam_centre_px'][0]:.1f}, {s['beam_centre_px'][1]:.1f}) px")
PY
  rm -rf "$dials_dir"
fi
# The far site's copy: every message, byte for byte the facility's (the gateway acknowledged each
# to the sender only once the far site had it).
here=$SINK/nxmx/messages.raw.part there=$hpc/there-0.raw.part
for _ in $(seq 60); do
  [ -s "$there" ] && [ "$(stat -c %s "$there")" = "$(stat -c %s "$here")" ] && break
  sleep 0.5
done
if ! cmp -s "$here" "$there"; then
  echo "the far site's copy differs from the facility's: $(stat -c %s "$there" 2>/dev/null || echo 0) of $(stat -c %s "$here") bytes" >&2
  tail -20 "$hpc/receive.log" >&2
  exit 1
fi
echo "far site  there-0.raw: $(stat -c %s "$there") bytes, the same as the facility's messages.raw (sha256 $(sha256sum "$there" | cut -c1-16))"
bin/kubectl-numastream status facility-stream2 | sed -n '/^consumers:/,/^conditions:/p' | sed '$d'
k delete streampipeline facility-stream2 --wait=true --timeout=60s >/dev/null
k delete remotesite hpc --wait=true --timeout=60s >/dev/null
kill $far_pid 2>/dev/null || true
k delete pod eiger-sim --wait=true --timeout=60s >/dev/null

say "7/7 teardown"
# The pipelines' objects go with them (owner references); the garbage collector takes a moment.
for _ in $(seq 60); do
  left=$(k get pods,jobs,services,configmaps,secrets -l 'numastream.io/pipeline in (facility,facility-hdf5,facility-stream2)' -o name | wc -l)
  [ "$left" -eq 0 ] && break
  sleep 0.5
done
echo "pipeline deleted: $left objects of it left"
fac down | tail -1
BIN_DIR=$SIM_BIN bash hack/sim-cluster.sh down >/dev/null
fac clean
[ "$left" -eq 0 ]
echo "demo OK ($(( $(date +%s) - started )) s)"
