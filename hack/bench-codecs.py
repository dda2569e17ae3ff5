"""make bench-codecs: bslz4 against the reference library, and what it changes end to end.

1. Per core, on the benchmarks' synthetic projections (11,059,200-byte 16-bit frames): our bslz4
   (numastream-agent bench codec) and the reference bitshuffle package, alternated, pinned to the
   same CPU, both in MB per CPU-second; medians of the rounds and their ratio.
2. Loopback, one sender into one receiver: lz4 vs bslz4 (null sink), raw MB/s and CPU-seconds per
   raw GB on each side (rusage of each process).
3. HDF5 file -> HDF5 file: a bslz4-stored DXchange file through the pipeline, frames passed
   through; the gateway's CPU-seconds per raw GB against the same stream into a file sink (decoded),
   buffered and with sink.io=direct (O_DIRECT), and the machine's CPU-seconds per raw GB until the
   files are on the device (the kernel's writeback of buffered files included). HDF5_DIR: where
   the files go (default: the temporary directory; it must take O_DIRECT for the direct row).
4. Whole processes from a file: FILE_FRAMES (384) projections in a raw file, `send` (file
   source, 2 compressing threads, 2 connections) into `receive` (2 receiving, 2 decompressing
   threads, null sink) as separate processes, lz4 and bslz4, against the CPU-work limit measured
   in the same round on the same file: 2 cores / (1/c + 1/d), c and d one core's compress and
   decompress speed (`bench codec --input`). Two data sets (DATA, default both): the synthetic
   projections and tomography-like ones (more photons, a denser sample: LZ4 compresses them
   slower, near 2:1). Also each side's CPU-seconds per raw GB, the CPU-seconds per raw GB outside
   the codec, and how busy the cores were.
Figures are medians; nothing here is a pass/fail test. PARTS=percore,loopback,hdf5,files (the
default: all four) runs some of them. BASELINE names another agent binary (an earlier build) whose HDF5
pass-through and whole-process runs run in the same rounds.
"""
import os

# The reference library parallelises with OpenMP; one core is the comparison.
os.environ["OMP_NUM_THREADS"] = "1"

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time

import bitshuffle
import h5py
import hdf5plugin
import numpy as np

from benchlib import free_port

AGENT = os.environ.get("NUMASTREAM_AGENT", "bin/numastream-agent")
BASELINE = os.environ.get("BASELINE", "")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CPU = str(max(os.sched_getaffinity(0)))
CHUNK = 11059200
FRAMES = int(os.environ.get("FRAMES", "240"))


def run_rusage(args):
    """Starts a process; returns (popen, a function that waits and gives (rc, stdout, cpu seconds))."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish():
        out = p.stdout.read()
        p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        return p.returncode, out, usage.ru_utime + usage.ru_stime
    return p, finish


def agent_codec(kernel=None):
    """One `bench codec` run pinned to CPU, with the bslz4 kernel `kernel` (None: the agent's own)."""
    env = dict(os.environ)
    if kernel:
        env["NUMASTREAM_BSLZ4_KERNEL"] = kernel
    out = subprocess.run(["taskset", "-c", CPU, AGENT, "bench", "codec", "--json", "--rounds", "3"],
                         capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)["codec"]


def per_core():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([AGENT, "synth", "--out", f"{tmp}/f.raw", "--chunk-bytes", str(CHUNK), "--frames", "4"], check=True)
        frames = np.fromfile(f"{tmp}/f.raw", dtype="<u2").reshape(4, -1)
    os.sched_setaffinity(0, {int(CPU)})
    # Every bit-shuffle kernel this CPU runs (the agent's choice is the last), each a row.
    order = ["portable", "avx2", "avx512", "avx512-gfni"]
    kernels = sorted(agent_codec()["bitshuffle_kernels"], key=lambda k: order.index(k) if k in order else len(order))
    ref_c, ref_d = [], []
    ours = {k: {"c": [], "d": [], "ratio": [], "shuffle": [], "unshuffle": []} for k in kernels}
    # Both sides in MB per CPU-second of the one core (the agent's bench codec counts its thread's
    # CPU time too), so time the core spent on other processes counts for neither.
    for _ in range(ROUNDS):
        t = time.thread_time()
        enc = [bitshuffle.compress_lz4(f, 0) for f in frames]
        ref_c.append(frames.nbytes / (time.thread_time() - t) / 1e6)
        t = time.thread_time()
        for e in enc:
            bitshuffle.decompress_lz4(e, frames[0].shape, frames.dtype, 0)
        ref_d.append(frames.nbytes / (time.thread_time() - t) / 1e6)
        ref_ratio = frames.nbytes / sum(e.nbytes + 12 for e in enc)
        for k in kernels:
            codec = agent_codec(k)
            assert codec["bslz4_kernel"] == k, codec["bslz4_kernel"]
            ours[k]["c"].append(codec["bslz4_compress_mbps"])
            ours[k]["d"].append(codec["bslz4_decompress_mbps"])
            ours[k]["ratio"].append(codec["bslz4_ratio"])
            ours[k]["shuffle"].append(codec["bitshuffle_kernels"][k]["shuffle_mbps"])
            ours[k]["unshuffle"].append(codec["bitshuffle_kernels"][k]["unshuffle_mbps"])
    os.sched_setaffinity(0, set(range(os.cpu_count())))
    m = statistics.median
    print(f"bslz4 per core ({ROUNDS} alternated rounds, CPU {CPU}, 4 projections of {CHUNK} B)")
    print(f"  {'':26} {'compress MB/s':>14} {'decompress MB/s':>16} {'ratio':>7} {'vs reference':>14}"
          f" {'bit-shuffle':>12} {'unshuffle':>10}")
    for k in kernels:
        o = ours[k]
        print(f"  {'numastream, ' + k:26} {m(o['c']):14.0f} {m(o['d']):16.0f} {m(o['ratio']):7.3f}"
              f" {m(o['c']) / m(ref_c):6.2f}, {m(o['d']) / m(ref_d):5.2f} {m(o['shuffle']):12.0f}"
              f" {m(o['unshuffle']):10.0f}")
    print(f"  {'bitshuffle 0.5.2 (ref)':26} {m(ref_c):14.0f} {m(ref_d):16.0f} {ref_ratio:7.3f}")


def stream(send_args, receive_args, chunk=CHUNK, agent=None):
    agent = agent or AGENT
    port = free_port()
    common = ["--endpoint", f"tcp://127.0.0.1:{port}", "--chunk-bytes", str(chunk), "--placement", "os"]
    rx, rx_done = run_rusage([agent, "receive", *common, *receive_args])
    time.sleep(0.3)
    tx, tx_done = run_rusage([agent, "send", *common, *send_args])
    tx_rc, tx_out, tx_cpu = tx_done()
    rx_rc, rx_out, rx_cpu = rx_done()
    if tx_rc or rx_rc:
        sys.exit(f"stream failed: send {tx_rc} receive {rx_rc}")
    s, r = json.loads(tx_out.strip().splitlines()[-1]), json.loads(rx_out.strip().splitlines()[-1])
    gb = r["raw_bytes"] / 1e9
    return s, r, tx_cpu / gb, rx_cpu / gb


def loopback():
    print(f"\nloopback, {FRAMES} synthetic projections, null sink (medians of", ROUNDS, "alternated rounds)")
    print(f"  {'codec':8} {'raw MB/s':>9} {'ratio':>6} {'sender CPU-s/GB':>16} {'gateway CPU-s/GB':>17}")
    rows = {"lz4": [], "bslz4": []}
    for _ in range(ROUNDS):
        for codec in rows:
            s, r, txc, rxc = stream(["--codec", codec, "--chunks", str(FRAMES)], [])
            rows[codec].append((r["raw_gbps"] * 125, r["ratio"], txc, rxc))
    for codec, v in rows.items():
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        print(f"  {codec:8} {med[0]:9.0f} {med[1]:6.2f} {med[2]:16.2f} {med[3]:17.2f}")


def machine_busy_seconds():
    """CPU-seconds every core of the machine spent busy so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def page_cache_mb():
    """The page cache's size now (/proc/meminfo Cached), MB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    return 0.0


def hdf5_pass_through():
    with tempfile.TemporaryDirectory(dir=os.environ.get("HDF5_DIR")) as tmp:
        subprocess.run([AGENT, "synth", "--out", f"{tmp}/f.raw", "--chunk-bytes", str(CHUNK), "--frames", "4"], check=True)
        frames = np.fromfile(f"{tmp}/f.raw", dtype="<u2").reshape(4, 2160, 2560)
        src = f"{tmp}/tomo.h5"
        with h5py.File(src, "w") as f:
            d = f.create_dataset("/exchange/data", shape=(FRAMES, 2160, 2560), dtype="<u2", chunks=(1, 2160, 2560),
                                 **hdf5plugin.Bitshuffle(cname="lz4"))
            for i in range(FRAMES):
                d[i] = frames[i % 4]
        print(f"\nHDF5 -> HDF5, {FRAMES} bslz4 projections ({FRAMES * CHUNK / 1e9:.2f} GB raw) (medians of {ROUNDS} rounds)")
        print(f"  files in {tmp}; machine: every core's busy time from the start until the files are on the device "
              "(sync), the kernel's writeback included; page cache: how much it grew during the run")
        print(f"  {'gateway sink':34} {'raw MB/s':>9} {'sender CPU-s/GB':>16} {'gateway CPU-s/GB':>17} {'machine CPU-s/GB':>17} {'page cache MB':>14}")
        rows = {"hdf5 (stored as received)": [], "hdf5 (stored, sink.io=direct)": [], "file (decoded, verified)": []}
        if BASELINE:
            rows["hdf5 (stored), baseline build"] = []
        for _ in range(ROUNDS):
            for name in rows:
                sink = ["--sink", "hdf5", "--sink-path", f"{tmp}/out.h5"] if name.startswith("hdf5") else \
                    ["--sink", "file", "--sink-path", f"{tmp}/out.raw"]
                if "direct" in name:
                    sink += ["--set", "sink.io=direct"]
                os.sync()
                busy, cached = machine_busy_seconds(), page_cache_mb()
                s, r, txc, rxc = stream(["--source", "hdf5", "--source-path", src, "--codec", "bslz4"], sink,
                                        agent=BASELINE if "baseline" in name else AGENT)
                grew = page_cache_mb() - cached
                os.sync()
                machine = (machine_busy_seconds() - busy) / (r["raw_bytes"] / 1e9)
                if "direct" in name and r.get("files_io", {}).get(f"{tmp}/out.h5") != "direct":
                    sys.exit(f"sink.io=direct was not written direct: {r.get('files_io')}")
                rows[name].append((r["raw_gbps"] * 125, txc, rxc, machine, grew))
                for f in ("out.h5", "out.raw"):
                    if os.path.exists(f"{tmp}/{f}"):
                        os.unlink(f"{tmp}/{f}")
        for name, v in rows.items():
            med = [statistics.median(x[i] for x in v) for i in range(5)]
            print(f"  {name:34} {med[0]:9.0f} {med[1]:16.2f} {med[2]:17.2f} {med[3]:17.2f} {med[4]:14.0f}")


# The data sets of the whole-process runs: the synthetic projections `synth` makes by default, and
# projections with more photons through a denser sample, which LZ4 compresses the way the paper's
# tomography data compresses (ratio near 2.0, about 0.8x the synthetic's speed per core).
DATA_SETS = {"synthetic": [], "tomography-like": ["--flat-field", "16", "--attenuation", "2.5"]}


def whole_processes():
    frames = int(os.environ.get("FILE_FRAMES", "384"))
    cores = len(os.sched_getaffinity(0))
    sets = [d for d in os.environ.get("DATA", ",".join(DATA_SETS)).split(",")]
    for d in sets:
        if d not in DATA_SETS:
            sys.exit(f"DATA: unknown data set {d!r} (known: {', '.join(DATA_SETS)})")
    keys = {"lz4": ("compress_mbps", "decompress_mbps", "ratio"),
            "bslz4": ("bslz4_compress_mbps", "bslz4_decompress_mbps", "bslz4_ratio")}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for d in sets:
            files[d] = f"{tmp}/{d}.raw"
            subprocess.run([AGENT, "synth", "--out", files[d], "--chunk-bytes", str(CHUNK), "--frames", str(frames)]
                           + DATA_SETS[d], check=True)
        print(f"\nwhole processes from a file, {frames} projections ({frames * CHUNK / 1e9:.2f} GB raw), "
              f"send C=2 S=2 -> receive R=2 D=2, null sink (medians of {ROUNDS} alternated rounds)")
        print(f"  limit: {cores} cores / (1/c + 1/d), c and d one core's speeds (`bench codec --input`) on the "
              "same file in the same round; outside the codec: both processes' CPU-s per raw GB less the codec's own "
              f"({cores} / limit)")
        print(f"  {'data':16} {'codec':17} {'ratio':>6} {'limit MB/s':>10} {'raw MB/s':>9} {'of limit':>9} "
              f"{'sender CPU-s/GB':>16} {'gateway CPU-s/GB':>17} {'outside codec':>14} {'cores busy':>11}")
        builds = {"": AGENT, "baseline": BASELINE} if BASELINE else {"": AGENT}
        rows = {(d, codec, b): [] for d in sets for codec in keys for b in builds}
        for _ in range(ROUNDS):
            for d in sets:
                out = subprocess.run([AGENT, "bench", "codec", "--json", "--rounds", "3", "--input", files[d],
                                      "--chunk-bytes", str(CHUNK)], capture_output=True, text=True, check=True).stdout
                codec_speeds = json.loads(out)["codec"]
                for (codec, (ck, dk, rk)), (b, agent) in itertools.product(keys.items(), builds.items()):
                    limit = cores / (1 / codec_speeds[ck] + 1 / codec_speeds[dk])
                    t0 = time.monotonic()
                    s, r, txc, rxc = stream(["--source", "file", "--source-path", files[d], "--codec", codec,
                                             "--threads", "compress=2", "--threads", "send=2", "--connections", "2"],
                                            ["--threads", "receive=2", "--threads", "decompress=2",
                                             "--connections", "2"], agent=agent)
                    wall = time.monotonic() - t0
                    if r["chunks"] != frames or not r["complete"] or r["lost"] or r["corrupt"]:
                        sys.exit(f"{d} {codec}: {r['chunks']} of {frames} chunks, lost {r['lost']}, "
                                 f"corrupt {r['corrupt']}")
                    mbps = r["raw_gbps"] * 125
                    gb = r["raw_bytes"] / 1e9
                    outside = txc + rxc - cores * 1000 / limit
                    rows[(d, codec, b)].append((codec_speeds[rk], limit, mbps, mbps / limit, txc, rxc, outside,
                                             (txc + rxc) * gb / wall / cores))
        for (d, codec, b), v in rows.items():
            m = [statistics.median(x[i] for x in v) for i in range(8)]
            print(f"  {d:16} {codec + (' (baseline)' if b else ''):17} {m[0]:6.2f} {m[1]:10.0f} {m[2]:9.0f} {m[3]:9.2f} {m[4]:16.2f} {m[5]:17.2f} "
                  f"{m[6]:14.2f} {m[7]:11.2f}")


if __name__ == "__main__":
    parts = os.environ.get("PARTS", "percore,loopback,hdf5,files").split(",")
    for name, part in (("percore", per_core), ("loopback", loopback), ("hdf5", hdf5_pass_through),
                       ("files", whole_processes)):
        if name in parts:
            part()
