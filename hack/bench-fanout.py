"""make bench-fanout: what each extra consumer of a gateway costs (the agent's `sinks`).

One lz4 stream of synthetic projections (CHUNKS chunks of 1 MiB, two connections, loopback) into
a gateway with 1, 2, 3 and 4 lossless file consumers, each writing its own copy to a tmpfs (so
that the figure is the fan-out's work, the copy into the page cache included, not a disk's).
Rounds alternate the consumer counts. For each: the gateway's raw MB/s (its summary) and its
CPU-seconds per raw GB (rusage), medians of ROUNDS rounds; then the cost of each consumer beyond
the first (CPU-s per GB) and the ratios to one consumer, measured in the same run. Also two
consumers whose second has a spill of its own (sinks[].spill, on the same tmpfs): every chunk for
it is written there and read back, and the row says what that costs beyond two plain consumers.
Figures, not a test: this machine is shared and noisy.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchlib import free_port, cpu_seconds

AGENT = os.environ.get("NUMASTREAM_AGENT", "bin/numastream-agent")
CHUNKS = int(os.environ.get("CHUNKS", "1000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
COUNTS = (1, 2, 3, 4)


def run(consumers, base, spill=False):
    port = free_port()
    out = tempfile.mkdtemp(dir=base)
    try:
        sinks = [{"kind": "file", "path": f"{out}/copy-{i}.raw"} for i in range(consumers)]
        if spill:
            sinks[-1]["spill"] = {"path": f"{out}/spill", "max_bytes": 1 << 30}
        common = ["--endpoint", f"tcp://127.0.0.1:{port}", "--connections", "2"]
        rx = subprocess.Popen([AGENT, "receive", *common, "--chunk-bytes", str(1 << 20), "--set", "sinks=" + json.dumps(sinks)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tx = subprocess.Popen([AGENT, "send", *common, "--codec", "lz4", "--chunks", str(CHUNKS), "--chunk-bytes",
                               str(1 << 20)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tx_out, tx_err = tx.stdout.read(), tx.stderr.read()
        cpu_seconds(tx)
        rx_out, rx_err = rx.stdout.read(), rx.stderr.read()
        rx_cpu = cpu_seconds(rx)
        if tx.returncode or rx.returncode:
            sys.exit(f"a run failed (send {tx.returncode}, receive {rx.returncode}):\n{tx_err}\n{rx_err}")
        r = json.loads(rx_out.strip().splitlines()[-1])
        if r["lost"] or r["corrupt"] or r["chunks"] != CHUNKS:
            sys.exit(f"the gateway did not verify every chunk: {r['chunks']} of {CHUNKS}, lost {r['lost']}")
        sizes = {os.path.getsize(f"{out}/copy-{i}.raw") for i in range(consumers)}
        if sizes != {r["raw_bytes"]}:
            sys.exit(f"a consumer's copy is not whole: sizes {sizes}, raw bytes {r['raw_bytes']}")
        gb = r["raw_bytes"] / 1e9
        return {"mbps": r["raw_bytes"] / 1e6 / r["seconds"], "rx": rx_cpu / gb}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    print(f"gateway fan-out: lz4, {CHUNKS} x 1 MiB synthetic projections, 2 connections, loopback, file consumers "
          f"on {base}; medians of {ROUNDS} alternated rounds")
    runs = {n: [] for n in (*COUNTS, "2s")}
    for _ in range(ROUNDS):
        for n in COUNTS:
            runs[n].append(run(n, base))
        runs["2s"].append(run(2, base, spill=True))
    med = {n: {k: statistics.median([x[k] for x in rs]) for k in ("mbps", "rx")} for n, rs in runs.items()}
    print("| consumers | raw MB/s | gateway CPU-s/GB | per consumer beyond the first, CPU-s/GB | CPU vs 1 consumer |")
    print("| --- | --- | --- | --- | --- |")
    for n in COUNTS:
        extra = (med[n]["rx"] - med[1]["rx"]) / (n - 1) if n > 1 else None
        print(f"| {n} | {med[n]['mbps']:.0f} | {med[n]['rx']:.2f} | {'-' if extra is None else f'{extra:.2f}'} | "
              f"{med[n]['rx'] / med[1]['rx']:.2f}x |")
    s = med["2s"]
    print(f"| 2, the second through its spill | {s['mbps']:.0f} | {s['rx']:.2f} | {s['rx'] - med[1]['rx']:.2f} "
          f"(the spill: {s['rx'] - med[2]['rx']:+.2f}) | {s['rx'] / med[1]['rx']:.2f}x |")


if __name__ == "__main__":
    main()
