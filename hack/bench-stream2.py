"""make bench-stream2: a simulated DECTRIS detector at fixed image rates through the pipeline on
loopback.

numastream-agent detector-sim replays the real EIGER2 R 500K series (bslz4, 16-bit, 10 images of
514 x 1030 pixels in 3 channels and the end message, after a start message of its own) SERIES
times at each rate; a sender (source stream2) carries the messages to a gateway whose stream2
sink re-emits them to a consumer that drops them (SINK=null: the gateway checks and drops them
itself). A Stream V2 detector's PUSH socket waits when nobody takes its messages, so a rate is
sustained when the detector kept it (it did not wait: at least 98% of the asked message rate) and
the gateway verified every message with none lost. For each rate: the detector's achieved rate,
MB per second, and the CPU-seconds each side spent per GB of messages (rusage of each process).
Beside each run, the same messages at the same rate through a bare ZeroMQ PULL -> PUSH forwarder
(numastream-agent forward: no copy, no parsing, no checksum, no acknowledgement) into a consumer
that drops them: its CPU-seconds per GB are the bound the sender and the gateway are held against
(each / forwarder).

SIZES (KiB per image, comma-separated, e.g. 16,64,256) runs synthetic series instead of the
recording: detector-sim --synthetic, 100 images per series of a 16-bit shape of that many KiB
raw (bslz4, as a detector compresses them: the messages are smaller; their mean size is
printed). Beside the detector's rate, the rate its last consumer took the messages at (first to
last message), for the pipeline and the forwarder: at "max", their ratio is what the pipeline
reaches of the bare forwarder's rate on the same messages.

RAW=1 runs raw chunks of each of SIZES instead (numastream's own frames, no detector): a sender
of MESSAGES (default 50000) synthetic chunks of that size (CODEC, default none) into a gateway
that verifies and drops them, against a bare ZeroMQ producer of as many messages of that size
(numastream-agent forward --blast) into a consumer that drops them: one hop each, two processes
each. The message rates (the gateway's and the consumer's) and each side's CPU-seconds per GB
against its bare counterpart (sender / producer, gateway / consumer).

ROUNDS (default 3) runs of each, alternated (forwarder, agent, baseline, forwarder, ...), and
the medians reported: the machine's noise hits all of them alike. BASELINE names another agent
binary (an earlier build) to run in the same rounds: its medians are printed beside, and the
ratio new / baseline. RATES (messages per second, comma-separated; 0 = as fast as it goes) and
SERIES choose the runs. Figures, not a test.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from benchlib import free_port, cpu_seconds

AGENT = os.environ.get("NUMASTREAM_AGENT", "bin/numastream-agent")
DATA = os.environ.get("NUMASTREAM_STREAM2_DATA",
                      os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "dectris-stream-v2"))
SERIES = int(os.environ.get("SERIES", "100"))
RATES = [float(r) for r in os.environ.get("RATES", "250,1000,4000,0").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SINK = os.environ.get("SINK", "stream2")
BASELINE = os.environ.get("BASELINE", "")
SIZES = [int(k) for k in os.environ.get("SIZES", "").split(",") if k]
IMAGES = 100  # per synthetic series


def synthetic_shape(kib):
    """A 16-bit ROWSxCOLS shape of `kib` KiB, twice as wide as high (or square)."""
    pixels = kib * 1024 // 2
    rows = 1
    while (rows * 2) * (rows * 2) * 2 <= pixels:
        rows *= 2
    return f"{rows}x{pixels // rows}"


def source_args(source):
    """detector-sim's arguments for a source: a recording's directory or ("synthetic", KiB)."""
    if isinstance(source, tuple):
        return ["--synthetic", "--images", str(IMAGES), "--shape", synthetic_shape(source[1])]
    return ["--replay", source, "--start"]


def detector(agent, port, source, rate):
    """detector-sim on `port`: SERIES series of `source` at `rate` messages/s (0: as taken)."""
    args = [agent, "detector-sim", "--endpoint", f"tcp://127.0.0.1:{port}", *source_args(source),
            "--series", str(SERIES)] + (["--rate-hz", str(rate)] if rate > 0 else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def taken_rate(summary):
    """Messages per second a consumer took, from its first message to its last. The detector's own
    figure counts what its PUSH socket queued (up to its high-water mark) as sent: on a short run
    it says more than went through."""
    return (summary["messages"] - 1) / summary["seconds"] if summary["seconds"] > 0 else float("nan")


def metric(port, name):
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", body, re.M)
    return float(m.group(1)) if m else None


def run(agent, source, rate):
    port, metrics, det, out = free_port(), free_port(), free_port(), free_port()
    sink = ["--sink", "stream2", "--sink-endpoint", f"tcp://127.0.0.1:{out}"] if SINK == "stream2" else []
    rx = subprocess.Popen([agent, "receive", "--endpoint", f"tcp://127.0.0.1:{port}", "--chunk-bytes", str(4 << 20),
                           "--placement", "os"] + sink, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    consumer = None
    if SINK == "stream2":
        consumer = subprocess.Popen([AGENT, "forward", "--from", f"tcp://127.0.0.1:{out}"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sim = detector(agent, det, source, rate)
    tx = subprocess.Popen([agent, "send", "--endpoint", f"tcp://127.0.0.1:{port}", "--chunk-bytes", str(4 << 20),
                           "--source", "stream2", "--source-endpoint", f"tcp://127.0.0.1:{det}", "--placement", "os",
                           "--metrics-listen", f"127.0.0.1:{metrics}"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sim_out, sim_err = sim.communicate(timeout=600)
    if sim.returncode != 0:
        sys.exit(f"detector-sim failed: {sim_err}")
    done = json.loads(sim_out.strip().splitlines()[-1])
    # Every message the detector sent acknowledged by the gateway, then a person's SIGINT ends the
    # endless stream.
    deadline = time.time() + 120
    while time.time() < deadline and (metric(metrics, "numastream_chunks_acknowledged") or 0) < done["messages"]:
        time.sleep(0.1)
    tx.send_signal(signal.SIGINT)
    tx_out = tx.stdout.read()
    tx_cpu = cpu_seconds(tx)
    rx_out = rx.stdout.read()
    rx_cpu = cpu_seconds(rx)
    if consumer:
        consumer.send_signal(signal.SIGINT)
        consumer_out = consumer.stdout.read()
        cpu_seconds(consumer)
        took = json.loads(consumer_out.strip().splitlines()[-1])
        taken = took["messages"]
        if taken != done["messages"]:
            sys.exit(f"the consumer took {taken} of {done['messages']} messages")
    if tx.returncode or rx.returncode:
        sys.exit(f"stream failed: send {tx.returncode} receive {rx.returncode}")
    s = json.loads(tx_out.strip().splitlines()[-1])
    r = json.loads(rx_out.strip().splitlines()[-1])
    gb = r["raw_bytes"] / 1e9
    return {
        "asked": rate, "messages": done["messages"], "achieved": (done["messages"] - 1) / done["seconds"],
        "mb_per_s": r["raw_bytes"] / 1e6 / done["seconds"], "delivered": r["chunks"], "lost": r["lost"],
        "corrupt": r["corrupt"], "malformed": s["stream2"]["malformed"], "tx_cpu_gb": tx_cpu / gb, "rx_cpu_gb": rx_cpu / gb,
        "kib_per_message": r["raw_bytes"] / 1024 / max(r["chunks"], 1),
        "taken": taken_rate(took) if consumer else float("nan"),
    }


def run_forwarder(source, rate):
    det, mid = free_port(), free_port()
    sink = subprocess.Popen([AGENT, "forward", "--from", f"tcp://127.0.0.1:{mid}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    fwd = subprocess.Popen([AGENT, "forward", "--from", f"tcp://127.0.0.1:{det}", "--to", f"tcp://127.0.0.1:{mid}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sim = detector(AGENT, det, source, rate)
    sim_out, sim_err = sim.communicate(timeout=600)
    if sim.returncode != 0:
        sys.exit(f"detector-sim failed: {sim_err}")
    done = json.loads(sim_out.strip().splitlines()[-1])
    time.sleep(1)  # what is queued reaches the consumer
    fwd.send_signal(signal.SIGINT)
    fwd_out = fwd.stdout.read()
    fwd_cpu = cpu_seconds(fwd)
    sink.send_signal(signal.SIGINT)
    sink_out = sink.stdout.read()
    cpu_seconds(sink)
    f, k = json.loads(fwd_out.strip().splitlines()[-1]), json.loads(sink_out.strip().splitlines()[-1])
    if f["messages"] != done["messages"] or k["messages"] != done["messages"]:
        sys.exit(f"forwarder: {f['messages']} forwarded and {k['messages']} taken of {done['messages']}")
    return {"achieved": (done["messages"] - 1) / done["seconds"], "taken": taken_rate(k),
            "cpu_gb": fwd_cpu / (f["bytes"] / 1e9)}


RAW = os.environ.get("RAW", "") == "1"
MESSAGES = int(os.environ.get("MESSAGES", "50000"))
CODEC = os.environ.get("CODEC", "none")


def run_raw(agent, size):
    """A sender of MESSAGES synthetic chunks of `size` bytes into a gateway that drops them."""
    port = free_port()
    common = ["--endpoint", f"tcp://127.0.0.1:{port}", "--chunk-bytes", str(size), "--placement", "os"]
    rx = subprocess.Popen([agent, "receive", *common], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.3)
    tx = subprocess.Popen([agent, "send", *common, "--codec", CODEC, "--chunks", str(MESSAGES)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tx_out, rx_out = tx.stdout.read(), rx.stdout.read()
    tx_cpu, rx_cpu = cpu_seconds(tx), cpu_seconds(rx)
    if tx.returncode or rx.returncode:
        sys.exit(f"raw stream failed: send {tx.returncode} receive {rx.returncode}: {tx.stderr.read()[-500:]}")
    r = json.loads(rx_out.strip().splitlines()[-1])
    if r["chunks"] != MESSAGES or r["lost"] or r["corrupt"]:
        sys.exit(f"raw stream: {r['chunks']} of {MESSAGES} chunks, lost {r['lost']}, corrupt {r['corrupt']}")
    gb = r["raw_bytes"] / 1e9
    return {"rate": r["chunks"] / r["seconds"], "tx_cpu_gb": tx_cpu / gb, "rx_cpu_gb": rx_cpu / gb}


def run_bare(size):
    """MESSAGES messages of `size` bytes from a bare ZeroMQ producer into a consumer that drops them."""
    port = free_port()
    consumer = subprocess.Popen([AGENT, "forward", "--from", f"tcp://127.0.0.1:{port}", "--messages", str(MESSAGES)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    producer = subprocess.Popen([AGENT, "forward", "--blast", str(size), "--to", f"tcp://127.0.0.1:{port}",
                                 "--messages", str(MESSAGES)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    p_out, c_out = producer.stdout.read(), consumer.stdout.read()
    p_cpu, c_cpu = cpu_seconds(producer), cpu_seconds(consumer)
    p, c = json.loads(p_out.strip().splitlines()[-1]), json.loads(c_out.strip().splitlines()[-1])
    if producer.returncode or consumer.returncode or c["messages"] != MESSAGES:
        sys.exit(f"bare: producer {producer.returncode}, consumer {consumer.returncode} took {c['messages']}")
    gb = c["bytes"] / 1e9
    return {"rate": taken_rate(c), "tx_cpu_gb": p_cpu / gb, "rx_cpu_gb": c_cpu / gb}


def raw_main():
    agents = [("agent", AGENT)] + ([("baseline", BASELINE)] if BASELINE else [])
    print(f"raw chunks on loopback: {MESSAGES} synthetic chunks per run (codec {CODEC}) into a gateway that drops "
          f"them, against a bare ZeroMQ producer into a consumer; medians of {ROUNDS} alternated rounds")
    print(f"  {'KiB':>5} {'binary':>8} {'msg/s':>8} {'bare msg/s':>10} {'of bare':>7} {'sender CPU-s/GB':>15} "
          f"{'producer':>8} {'sender/bare':>11} {'gateway CPU-s/GB':>16} {'consumer':>8} {'gateway/bare':>12}")
    for kib in SIZES:
        runs = {name: [] for name, _ in agents}
        bare = []
        for _ in range(ROUNDS):
            bare.append(run_bare(kib * 1024))
            for name, agent in agents:
                runs[name].append(run_raw(agent, kib * 1024))
        b = {k: median([x[k] for x in bare]) for k in ("rate", "tx_cpu_gb", "rx_cpu_gb")}
        for name, _ in agents:
            m = {k: median([x[k] for x in runs[name]]) for k in ("rate", "tx_cpu_gb", "rx_cpu_gb")}
            print(f"  {kib:5d} {name:>8} {m['rate']:8.0f} {b['rate']:10.0f} {m['rate'] / b['rate']:7.2f} "
                  f"{m['tx_cpu_gb']:15.2f} {b['tx_cpu_gb']:8.2f} {m['tx_cpu_gb'] / b['tx_cpu_gb']:11.2f} "
                  f"{m['rx_cpu_gb']:16.2f} {b['rx_cpu_gb']:8.2f} {m['rx_cpu_gb'] / b['rx_cpu_gb']:12.2f}")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main():
    series_dir = os.path.join(DATA, "r500k_bm_bslz4_16bit")
    if SIZES:
        sources = [(f"{k} KiB", ("synthetic", k)) for k in SIZES]
    elif os.path.isdir(series_dir):
        sources = [("EIGER2", series_dir)]
    else:
        sys.exit(f"bench-stream2: the EIGER2 recordings are not at {DATA} (set NUMASTREAM_STREAM2_DATA)")
    agents = [("agent", AGENT)] + ([("baseline", BASELINE)] if BASELINE else [])
    what = (f"synthetic series of {IMAGES} images of " + ", ".join(f"{k} KiB" for k in SIZES) + " raw (bslz4)" if SIZES
            else "the EIGER2 R 500K bslz4 16-bit recording (12 messages each, ~0.52 MB per image message)")
    print(f"stream2 on loopback: {SERIES} series of {what}, {SINK} sink at the gateway, placement os; medians of "
          f"{ROUNDS} alternated rounds" + (f"; baseline {BASELINE}" if BASELINE else ""))
    print(f"  {'source':>8} {'asked msg/s':>11} {'binary':>8} {'KiB/msg':>7} {'achieved msg/s':>14} {'taken msg/s':>11} "
          f"{'fwd taken':>9} "
          f"{'of fwd':>6} {'MB/s':>6} {'lost':>5} {'sustained':>9} {'sender CPU-s/GB':>15} {'gateway CPU-s/GB':>16} "
          f"{'forwarder CPU-s/GB':>18} {'sender/fwd':>10} {'gateway/fwd':>11}")
    for label, source in sources:
        best = None
        for rate in RATES:
            runs = {name: [] for name, _ in agents}
            fwd = []
            for _ in range(ROUNDS):
                fwd.append(run_forwarder(source, rate))
                for name, agent in agents:
                    runs[name].append(run(agent, source, rate))
            b = median([f["cpu_gb"] for f in fwd])
            fwd_rate = median([f["taken"] for f in fwd])
            asked = "max" if rate == 0 else f"{rate:.0f}"
            medians = {}
            for name, _ in agents:
                rs = runs[name]
                m = {k: median([r[k] for r in rs])
                     for k in ("achieved", "taken", "mb_per_s", "tx_cpu_gb", "rx_cpu_gb", "kib_per_message")}
                lost = sum(r["lost"] + r["corrupt"] + (r["messages"] - r["delivered"]) for r in rs)
                ok = lost == 0 and (rate == 0 or all(r["achieved"] >= 0.98 * rate for r in rs))
                medians[name] = m
                if name == "agent" and ok and (best is None or m["mb_per_s"] > best["mb_per_s"]):
                    best = m
                print(f"  {label:>8} {asked:>11} {name:>8} {m['kib_per_message']:7.1f} {m['achieved']:14.0f} "
                      f"{m['taken']:11.0f} {fwd_rate:9.0f} {m['taken'] / fwd_rate:6.2f} {m['mb_per_s']:6.0f} {lost:5d} "
                      f"{'yes' if ok else 'no':>9} {m['tx_cpu_gb']:15.2f} {m['rx_cpu_gb']:16.2f} {b:18.2f} "
                      f"{m['tx_cpu_gb'] / b:10.2f} {m['rx_cpu_gb'] / b:11.2f}")
            if BASELINE:
                n, o = medians["agent"], medians["baseline"]
                print(f"  {'':>8} {'':>11} {'new/old':>8} {'':>7} {'':>14} {'':>11} {'':>9} {'':>6} {'':>6} {'':>5} {'':>9} "
                      f"{n['tx_cpu_gb'] / o['tx_cpu_gb']:15.2f} {n['rx_cpu_gb'] / o['rx_cpu_gb']:16.2f}")
        if best:
            print(f"{label}: highest sustained {best['achieved']:.0f} messages/s, {best['mb_per_s']:.0f} MB/s of detector "
                  f"messages, 0 lost")


if __name__ == "__main__":
    if RAW:
        if not SIZES:
            sys.exit("bench-stream2: RAW=1 needs SIZES (KiB per chunk, e.g. 16,64,256)")
        raw_main()
    else:
        main()
