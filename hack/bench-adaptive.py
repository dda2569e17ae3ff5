"""make bench-adaptive: the same stream with placement.adaptive false and true, alternated in one
run, on loopback (docs/adaptive.md).

Plans of one lz4 stream of synthetic projections (CHUNKS chunks of 1 MiB, two connections):
  - "1 compressor": the plan gave compression one thread, and it is the bottleneck while the
    two sending threads idle (what a plan made from a wrong calibration or ratio looks like);
  - "planned": the agent's own plan for this machine (the adaptive runtime must not lose there);
  - the same two on a changing stream: the beam drops halfway (source.change), and the frames'
    lz4 ratio goes from ~2.0 to ~3.5.
For each: the gateway's raw MB/s (its summary) and the CPU-seconds per raw GB of the sender and
the gateway (rusage of each process), medians of ROUNDS alternated rounds, and adaptive/static
ratios from the same run. Figures, not a test: this machine is shared and noisy.
"""
import json
import os
import statistics
import subprocess
import sys

from benchlib import free_port, cpu_seconds

AGENT = os.environ.get("NUMASTREAM_AGENT", "bin/numastream-agent")
CHUNKS = int(os.environ.get("CHUNKS", "4000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def run(adaptive, plan):
    port = free_port()
    common = ["--endpoint", f"tcp://127.0.0.1:{port}", "--connections", "2", "--set",
              f"placement.adaptive={'true' if adaptive else 'false'}"]
    rx = subprocess.Popen([AGENT, "receive", *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tx = subprocess.Popen([AGENT, "send", *common, "--codec", "lz4", "--chunks", str(CHUNKS), "--chunk-bytes",
                           str(1 << 20), *plan], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tx_out, tx_err = tx.stdout.read(), tx.stderr.read()
    tx_cpu = cpu_seconds(tx)
    rx_out, rx_err = rx.stdout.read(), rx.stderr.read()
    rx_cpu = cpu_seconds(rx)
    if tx.returncode or rx.returncode:
        sys.exit(f"a run failed (send {tx.returncode}, receive {rx.returncode}):\n{tx_err}\n{rx_err}")
    s = json.loads(tx_out.strip().splitlines()[-1])
    r = json.loads(rx_out.strip().splitlines()[-1])
    if r["lost"] or r["corrupt"] or r["chunks"] != CHUNKS:
        sys.exit(f"the gateway did not verify every chunk: {r['chunks']} of {CHUNKS}, lost {r['lost']}")
    gb = r["raw_bytes"] / 1e9
    changes = s.get("adaptive", {}).get("last_changes", [])
    return {"mbps": r["raw_bytes"] / 1e6 / r["seconds"], "tx": tx_cpu / gb, "rx": rx_cpu / gb,
            "active": s.get("adaptive", {}).get("active", s["stages"]["compress"]["threads"]),
            "first_change_s": changes[0]["at_s"] if changes else None}


def main():
    change = ["--set", f'source.change={{"at_chunk":{CHUNKS // 2},"flat_field":0.55}}']
    one = ["--set", "placement.stages.compress.threads=1"]
    plans = {"1 compressor": one, "planned": [], "1 compressor, changing": one + change, "planned, changing": change}
    print(f"placement.adaptive false vs true, lz4, {CHUNKS} x 1 MiB synthetic projections, 2 connections, loopback; "
          f"medians of {ROUNDS} alternated rounds")
    print("| plan | adaptive | raw MB/s | sender CPU-s/GB | gateway CPU-s/GB | compress threads at the end | first change at |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, plan in plans.items():
        runs = {False: [], True: []}
        for _ in range(ROUNDS):
            for adaptive in (False, True):
                runs[adaptive].append(run(adaptive, plan))
        med = {a: {k: statistics.median([x[k] for x in rs]) for k in ("mbps", "tx", "rx")} for a, rs in runs.items()}
        for a in (False, True):
            firsts = [x["first_change_s"] for x in runs[a] if x["first_change_s"] is not None]
            print(f"| {name} | {str(a).lower()} | {med[a]['mbps']:.0f} | {med[a]['tx']:.2f} | {med[a]['rx']:.2f} | "
                  f"{', '.join(str(x['active']) for x in runs[a])} | "
                  f"{(f'{statistics.median(firsts):.1f} s' if firsts else '-')} |")
        print(f"| {name} | true / false | {med[True]['mbps'] / med[False]['mbps']:.2f}x | "
              f"{med[True]['tx'] / med[False]['tx']:.2f}x | {med[True]['rx'] / med[False]['rx']:.2f}x | | |")


if __name__ == "__main__":
    main()
