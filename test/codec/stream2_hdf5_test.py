"""Stream V2 series through real agents into HDF5 files, read back by h5py + hdf5plugin and held
against the detector's own messages decoded by the reference libraries (cbor2, bitshuffle, lz4).

detector-sim (replaying the real EIGER2 R 500K recordings, or a synthetic series) -> send
--source stream2 -> receive --sink hdf5: one NXmx-style file per series.

Run: NUMASTREAM_AGENT=bin/numastream-agent $(hack/pyenv.sh) -m unittest -v test/codec/stream2_hdf5_test.py
"""
import glob
import json
import os
import re
import signal
import struct
import subprocess
import tempfile
import time
import unittest

import bitshuffle
import cbor2
import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle and LZ4 filters with h5py)
import lz4.block
import numpy as np

from realdata import AGENT, REAL, REQUIRE_REAL, TYPED_ARRAY, free_port, recording


def decode_bslz4(framed, dtype):
    raw_bytes, block_bytes = struct.unpack(">QI", framed[:12])
    body = np.frombuffer(framed[12:], dtype=np.uint8)
    return bitshuffle.decompress_lz4(body, (raw_bytes // dtype.itemsize,), dtype, block_bytes // dtype.itemsize)


def decode_lz4(framed, dtype):
    """The HDF5 LZ4 filter's framing, block by block with the lz4 package."""
    raw_bytes, block = struct.unpack(">QI", framed[:12])
    out, pos = bytearray(), 12
    while len(out) < raw_bytes:
        n = min(block, raw_bytes - len(out))
        (c,) = struct.unpack(">I", framed[pos:pos + 4])
        pos += 4
        data = framed[pos:pos + c]
        out += data if c == n else lz4.block.decompress(data, uncompressed_size=n)
        pos += c
    assert pos == len(framed), "bytes after the last block"
    return np.frombuffer(bytes(out), dtype=dtype)


def channels_of(message):
    """{channel: (pixels decoded by the reference libraries, the compressed bytes, algorithm)}."""
    out = {}
    for name, arr in message["data"].items():
        shape, typed = arr.value
        algorithm, elem, data = typed.value.value
        dtype = TYPED_ARRAY[typed.tag]
        data = bytes(data)
        pixels = (decode_bslz4 if algorithm == "bslz4" else decode_lz4)(data, dtype)
        out[name] = (pixels.reshape(shape), data, algorithm)
    return out


class Series:
    """A detector, a sender and a gateway on loopback; stop() ends the run and returns the summaries."""

    def __init__(self, tmp, sim_args, sink_path, tx_args=(), rx_args=()):
        det = f"tcp://127.0.0.1:{free_port()}"
        data = f"tcp://127.0.0.1:{free_port()}"
        self.logs = {n: open(os.path.join(tmp, n + ".log"), "w+") for n in ("sim", "send", "receive")}
        self.rx_argv = [AGENT, "receive", "--endpoint", data, "--sink", "hdf5", "--sink-path", sink_path, *rx_args]
        self.rx = subprocess.Popen(self.rx_argv, stdout=subprocess.PIPE, stderr=self.logs["receive"], text=True)
        self.sim = subprocess.Popen([AGENT, "detector-sim", "--endpoint", det, "--linger-s", "30", *sim_args],
                                    stdout=subprocess.PIPE, stderr=self.logs["sim"], text=True)
        self.tx_argv = [AGENT, "send", "--endpoint", data, "--source", "stream2", "--source-endpoint", det, *tx_args]
        self.tx = subprocess.Popen(self.tx_argv, stdout=subprocess.PIPE, stderr=self.logs["send"], text=True)

    def restart_receiver(self):
        """A new gateway (after the last one exited) on the same port and sink path."""
        self.rx = subprocess.Popen(self.rx_argv, stdout=subprocess.PIPE, stderr=self.logs["receive"], text=True)

    def restart_sender(self):
        """A new sender of the same stream (after the last one exited), logging to the same file."""
        self.tx = subprocess.Popen(self.tx_argv, stdout=subprocess.PIPE, stderr=self.logs["send"], text=True)

    def log(self):
        text = ""
        for name, f in self.logs.items():
            if not f.closed:
                f.flush()
            with open(f.name) as r:
                text += f"--- {name}\n{r.read()}"
        return text

    def stop(self, until, timeout=60):
        """Waits for `until()` (or the timeout), then ends the sender with SIGINT, as a person would."""
        deadline = time.time() + timeout
        while not until() and time.time() < deadline:
            time.sleep(0.1)
        self.tx.send_signal(signal.SIGINT)
        tx_out, _ = self.tx.communicate(timeout=60)
        rx_out, _ = self.rx.communicate(timeout=60)
        self.sim.kill()
        self.sim.communicate()
        for f in self.logs.values():
            f.close()
        last = lambda out: json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        return self.tx.returncode, self.rx.returncode, last(tx_out), last(rx_out)


class SeriesIntoHdf5(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    SINK_IO = []  # the gateway's sink.io: HDF5's default (through the page cache)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.tmp])

    def series(self, *args, **kwargs):
        run = Series(self.tmp, *args, rx_args=self.SINK_IO, **kwargs)
        self.runs = getattr(self, "runs", []) + [run]
        return run

    def recording(self, name):
        return recording(self, name)

    def assertEveryImageInTheFileOrNamed(self, series, rx_rc, final, images, log):
        """The series published complete, or its .part (and the gateway's summary) naming by id the
        images it lacks: never an image both absent and unnamed. Returns how many are named."""
        missing = 0
        if series["complete"]:
            self.assertEqual(rx_rc, 0, log)
        else:
            self.assertNotEqual(rx_rc, 0, log)
            named = re.search(r"image ids [0-9, -.]+ missing \(([0-9]+) of %d\)" % images, series["lacks"])
            self.assertIsNotNone(named, log)
            missing = int(named.group(1))
            with h5py.File(final + ".part", "r") as f:
                self.assertIn(named.group(0), f["/entry"].attrs["incomplete"])
        self.assertEqual(series["images"] + missing, images, "every image in the file or named missing:\n" + log)
        return missing

    def assertSeriesFile(self, path, messages, series_id, unique_id, filter_id):
        """Every channel of every image message at its image_id, the chunk the detector's bytes."""
        with h5py.File(path, "r") as f:
            self.assertEqual(f["/entry"].attrs["NX_class"], "NXentry")
            self.assertEqual(f["/entry/data"].attrs["NX_class"], "NXdata")
            self.assertEqual(f["/entry/instrument/detector"].attrs["NX_class"], "NXdetector")
            self.assertEqual(int(f["/entry"].attrs["series_id"]), series_id)
            self.assertEqual(f["/entry"].attrs["series_unique_id"], unique_id)
            images = [m for m in messages if m["type"] == "image"]
            for m in images:
                for name, (pixels, data, algorithm) in channels_of(m).items():
                    ds = f[f"/entry/data/{name}"]
                    self.assertEqual(ds.shape, (len(images),) + pixels.shape, name)
                    self.assertEqual(ds.dtype, pixels.dtype, name)
                    self.assertIn(filter_id, ds._filters, f"{name}: declared with the filter its chunks carry")
                    i = m["image_id"]
                    mask, stored = ds.id.read_direct_chunk((i, 0, 0))
                    self.assertEqual((mask, stored), (0, data), f"{name} image {i}: the chunk is the detector's bytes")
                    np.testing.assert_array_equal(ds[i], pixels, err_msg=f"{name} image {i}")
            return f["/entry/instrument/detector/stream2_start"][()].tobytes()

    def test_real_eiger2_series_land_in_nxmx_files(self):
        folders = {"r500k_bm_bslz4_8bit": "32008", "r500k_bm_bslz4_16bit": "32008",
                   "r500k_bm_bslz4_32bit": "32008", "r500k_bm_lz4_16bit": "32004"}
        if not all(os.path.isdir(os.path.join(REAL, f)) for f in folders):
            if REQUIRE_REAL:
                self.fail(f"NUMASTREAM_REQUIRE_REAL=1: the EIGER2 recordings are not in {REAL}")
            self.skipTest(f"the EIGER2 recordings are not in {REAL}")
        for folder, filter_id in folders.items():
            with self.subTest(folder=folder):
                files = sorted(glob.glob(os.path.join(REAL, folder, "*")))
                messages = [load_cbor(p) for p in files]
                sink = os.path.join(self.tmp, folder + ".h5")
                run = self.series(["--replay", os.path.join(REAL, folder), "--start"], sink)
                series_id, unique = messages[0]["series_id"], messages[0]["series_unique_id"]
                final = os.path.join(self.tmp, f"{folder}_series_{series_id}.h5")
                tx_rc, rx_rc, sent, received = run.stop(until=lambda: os.path.exists(final))
                log = run.log()
                self.assertEqual((tx_rc, rx_rc), (0, 0), log)
                self.assertEqual((received["lost"], received["corrupt"], received["incomplete_files"]), (0, 0, []), log)
                self.assertEqual(received["stream2_series"],
                                 [{"series_id": series_id, "series_unique_id": unique, "file": final,
                                   "images": 10, "complete": True}], log)
                start = cbor2.loads(self.assertSeriesFile(final, messages, series_id, unique, filter_id))
                self.assertEqual((start["type"], start["series_id"], start["number_of_images"]), ("start", series_id, 10))
                with h5py.File(final, "r") as f:
                    self.assertEqual(int(f["/entry/instrument/detector/number_of_images"][()]), 10)
                    self.assertEqual(sorted(f["/entry/data"]), ["difference", "threshold_1", "threshold_2"])

    def test_synthetic_series_with_their_start_metadata(self):
        for compression, filter_id in (("bslz4", "32008"), ("lz4", "32004")):
            with self.subTest(compression=compression):
                sink = os.path.join(self.tmp, compression + "-{series}.h5")
                args = ["--synthetic", "--series", "2", "--images", "6", "--shape", "64x100", "--channels", "t1,t2",
                        "--compression", compression, "--seed", "11"]
                run = self.series(args, sink)
                finals = [os.path.join(self.tmp, f"{compression}-{s}.h5") for s in (1, 2)]
                tx_rc, rx_rc, sent, received = run.stop(until=lambda: all(os.path.exists(p) for p in finals))
                log = run.log()
                self.assertEqual((tx_rc, rx_rc), (0, 0), log)
                self.assertEqual([s["complete"] for s in received["stream2_series"]], [True, True], log)
                self.assertEqual(sent["stream2"]["series_ended"], 2, log)
                # The pixels: projections regenerated by the agent's synth (image i, channel c: i + 5c).
                src = os.path.join(self.tmp, "src.raw")
                subprocess.run([AGENT, "synth", "--out", src, "--chunk-bytes", str(64 * 100 * 2), "--width", "100",
                                "--frames", "11", "--seed", "11"], check=True, capture_output=True)
                proj = np.fromfile(src, dtype="<u2").reshape(11, 64, 100)
                for s, path in enumerate(finals, start=1):
                    with h5py.File(path, "r") as f:
                        for c, name in enumerate(("t1", "t2")):
                            ds = f[f"/entry/data/{name}"]
                            self.assertIn(filter_id, ds._filters)
                            self.assertEqual(ds.shape, (6, 64, 100))
                            for i in range(6):
                                np.testing.assert_array_equal(ds[i], proj[i + 5 * c], err_msg=f"series {s} {name} {i}")
                        det = f["/entry/instrument/detector"]
                        self.assertEqual(int(f["/entry"].attrs["series_id"]), s)
                        self.assertEqual([c.decode() if isinstance(c, bytes) else c for c in det["channels"][()]],
                                         ["t1", "t2"])
                        self.assertEqual((int(det["image_size_y"][()]), int(det["image_size_x"][()])), (64, 100))
                        self.assertEqual(float(det["beam_center_x"][()]), 50.0)
                        mask = det["pixel_mask/t2"][()]
                        self.assertEqual((mask.shape, mask.dtype, int(mask[0, 0]), int(mask.sum())),
                                         ((64, 100), np.dtype("<u4"), 1, 1))

    def test_a_detector_gone_mid_series_leaves_its_file_incomplete_and_named(self):
        sink = os.path.join(self.tmp, "gone.h5")
        # A slow detector: 40 images at 20 messages/s; it is killed a few images in.
        run = self.series(["--synthetic", "--images", "40", "--shape", "64x96", "--rate-hz", "20"], sink)
        part = os.path.join(self.tmp, "gone_series_1.h5.part")
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(part):
            time.sleep(0.05)
        time.sleep(0.4)
        run.sim.kill()
        tx_rc, rx_rc, sent, received = run.stop(until=lambda: False, timeout=1.5)
        log = run.log()
        self.assertEqual(sent["stream2"]["series_incomplete"], 1, log)
        self.assertNotEqual(rx_rc, 0, "a series left incomplete fails the gateway's run:\n" + log)
        self.assertEqual(len(received["incomplete_files"]), 1, log)
        self.assertIn("gone_series_1.h5.part (series 1", received["incomplete_files"][0])
        # The sender's end message says why; the gateway names the series with it.
        self.assertIn("disconnected after", received["incomplete_files"][0])
        series = received["stream2_series"][0]
        self.assertFalse(series["complete"], log)
        self.assertIn("before its end message", series["lacks"], log)
        self.assertEqual(received["stream2_series_incomplete"], 1, log)
        self.assertGreater(series["images"], 0, log)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "gone_series_1.h5")), "never published as complete")
        with h5py.File(part, "r") as f:  # what did arrive is readable
            self.assertEqual(f["/entry/data/threshold_1"].shape[0], series["images"])

    def test_image_ids_the_detector_never_sent_are_named_and_the_series_is_not_published(self):
        # Every message numastream carried arrives (its own sequence has no hole), but the detector
        # never sent images 5-7 of 20: the series' own numbering says so.
        sink = os.path.join(self.tmp, "holes.h5")
        run = self.series(["--synthetic", "--images", "20", "--shape", "64x96", "--drop-images", "5-7"], sink)
        part = os.path.join(self.tmp, "holes_series_1.h5.part")
        tx_rc, rx_rc, sent, received = run.stop(until=lambda: any("holes_series_1" in f for f in os.listdir(self.tmp))
                                                and received_all(run), timeout=30)
        log = run.log()
        self.assertEqual(received.get("lost"), 0, log)
        self.assertNotEqual(rx_rc, 0, "a series with images missing fails the gateway's run:\n" + log)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "holes_series_1.h5")), "never published as complete")
        series = received["stream2_series"][0]
        self.assertFalse(series["complete"], log)
        self.assertEqual(series["images"], 17, log)
        self.assertIn("image ids 5-7 missing (3 of 20)", series["lacks"], log)
        self.assertIn("image ids 5-7 missing", received["stream2_series_incomplete_last"][0], log)
        with h5py.File(part, "r") as f:  # the file itself says what it lacks
            self.assertIn("image ids 5-7 missing (3 of 20)", f["/entry"].attrs["incomplete"])
            self.assertEqual(f["/entry/data/threshold_1"].shape[0], 20)


    def test_a_sender_stopped_mid_series_hands_the_series_to_the_next_sender(self):
        # A real EIGER2 series (10 images, 11 messages) at 5 messages/s; its sender gets SIGTERM
        # (a drain, an eviction) a few images in. By default it reads on until the detector pauses
        # (after the series), so the series is complete before the next sender starts. With
        # source.drain_s cut short it stops mid-series: the next sender (same state_dir) carries
        # the rest of the series, numbered on after what the first one had acknowledged. Either
        # way every image is in the file, or the file and the gateway name it missing.
        folder = self.recording("r500k_bm_bslz4_16bit")
        messages = [load_cbor(p) for p in sorted(glob.glob(os.path.join(folder, "*")))]
        series_id, unique = messages[0]["series_id"], messages[0]["series_unique_id"]
        for case, drain, said in (("pause", [], "the detector paused"),
                                  ("cut", ["--set", "source.drain_s=0.05"], "did not pause within")):
            with self.subTest(case=case):
                state = os.path.join(self.tmp, case + "-state")
                os.makedirs(state)
                sink = os.path.join(self.tmp, case + ".h5")
                run = self.series(["--replay", folder, "--start", "--rate-hz", "5"], sink,
                             ["--set", f'state_dir="{state}"', *drain])
                final = os.path.join(self.tmp, f"{case}_series_{series_id}.h5")
                deadline = time.time() + 30
                while time.time() < deadline and not os.path.exists(final + ".part"):
                    time.sleep(0.05)
                time.sleep(0.6)  # a few images into the series
                run.tx.send_signal(signal.SIGTERM)
                first_out, _ = run.tx.communicate(timeout=60)
                self.assertTrue(first_out.strip(), run.log())
                first = json.loads(first_out.strip().splitlines()[-1])
                self.assertEqual(run.tx.returncode, 128 + signal.SIGTERM, "paused, not ended:\n" + run.log())
                self.assertIn(said, run.log())
                run.restart_sender()
                resumed = lambda: "resuming a live source at chunk" in run.log()
                tx_rc, rx_rc, sent, received = run.stop(
                    until=lambda: resumed() and (os.path.exists(final) or run.sim.poll() is not None), timeout=30)
                log = run.log()
                self.assertEqual(tx_rc, 0, log)
                self.assertEqual((received["lost"], received["corrupt"]), (0, 0), log)
                self.assertEqual(received["streams"][0]["declared_missing"], 0,
                                 "the first sender had everything it read acknowledged:\n" + log)
                series = received["stream2_series"][0]
                # Images in transit when the first sender's socket closed would be named by image id.
                missing = self.assertEveryImageInTheFileOrNamed(series, rx_rc, final, 10, log)
                if series["complete"]:
                    self.assertSeriesFile(final, messages, series_id, unique, "32008")
                print(f"[stream2] sender SIGTERM mid-series ({case}): the first sender read {first['chunks']} "
                      f"messages, the next one {sent['chunks']}; series complete {series['complete']}, "
                      f"{missing} images named missing")


    def test_a_sender_killed_mid_series_leaves_every_image_delivered_or_named(self):
        # A detector series; the gateway pauses (busy) and meanwhile the sender is SIGKILLed and
        # started again with its state_dir. What the dead sender took and never had acknowledged
        # is declared missing by sequence; the series file names the image ids it lacks; every
        # other image is in it. Never an image both absent and unnamed. The real EIGER2 series
        # (10 images at 5/s) mostly survives (what the dead sender sent reaches the gateway once it
        # resumes); 300 synthetic 1 MiB images at 100/s leave the dead sender holding some.
        folder = self.recording("r500k_bm_bslz4_16bit")
        cases = (("eiger2", ["--replay", folder, "--start", "--rate-hz", "5"], 10, 0.6, False),
                 ("synthetic", ["--synthetic", "--images", "300", "--shape", "512x1024", "--rate-hz", "100"], 300, 1.5,
                  True))
        for case, sim, images, pause, must_lose in cases:
            with self.subTest(case=case):
                state = os.path.join(self.tmp, case + "-state")
                os.makedirs(state)
                run = self.series(sim, os.path.join(self.tmp, case + ".h5"),
                             ["--set", f'state_dir="{state}"', "--chunk-bytes", str(4 << 20)])
                final = os.path.join(self.tmp, f"{case}_series_1.h5") if case == "synthetic" else os.path.join(
                    self.tmp, f"{case}_series_{load_cbor(sorted(glob.glob(os.path.join(folder, '*')))[0])['series_id']}.h5")
                deadline = time.time() + 30
                while time.time() < deadline and not os.path.exists(final + ".part"):
                    time.sleep(0.05)
                time.sleep(0.3)
                run.rx.send_signal(signal.SIGSTOP)
                time.sleep(pause)
                run.tx.send_signal(signal.SIGKILL)
                run.tx.communicate(timeout=30)
                run.restart_sender()
                time.sleep(0.3)
                run.rx.send_signal(signal.SIGCONT)
                resumed = lambda: "resuming a live source at chunk" in run.log()
                tx_rc, rx_rc, sent, received = run.stop(
                    until=lambda: resumed() and (os.path.exists(final) or run.sim.poll() is not None), timeout=60)
                log = run.log()
                self.assertEqual(tx_rc, 0, log)
                declared = received["streams"][0]["declared_missing"]
                self.assertEqual(received["lost"], declared, log)
                if must_lose:
                    self.assertGreater(declared, 0, "the pause left the dead sender holding messages:\n" + log)
                series = received["stream2_series"][0]
                missing = self.assertEveryImageInTheFileOrNamed(series, rx_rc, final, images, log)
                if series["complete"]:
                    self.assertEqual(declared, 0, log)
                print(f"[stream2] {case}: sender SIGKILL mid-series during a {pause} s gateway pause: {declared} "
                      f"messages declared missing by the next sender, {missing} image ids named missing, "
                      f"{series['images']} of {images} images in the file")


    def test_a_gateway_killed_mid_series_goes_on_writing_the_same_file(self):
        # The gateway is SIGKILLed in the middle of a series and started again: it reopens the
        # series' .part (its messages are acknowledged only once flushed there), the sender resends
        # what was not acknowledged, and the series is published complete in one file, every image
        # the detector's bytes. Real EIGER2 series (10 images at 5/s) and 60 synthetic ones at 20/s.
        folder = self.recording("r500k_bm_bslz4_16bit")
        messages = [load_cbor(p) for p in sorted(glob.glob(os.path.join(folder, "*")))]
        cases = (("eiger2", ["--replay", folder, "--start", "--rate-hz", "5"], messages[0]["series_id"], 10),
                 ("synthetic", ["--synthetic", "--images", "60", "--shape", "64x100", "--channels", "t1,t2",
                                "--seed", "11", "--rate-hz", "20"], 1, 60))
        for case, sim, series_id, images in cases:
            with self.subTest(case=case):
                run = self.series(sim, os.path.join(self.tmp, case + ".h5"))
                final = os.path.join(self.tmp, f"{case}_series_{series_id}.h5")
                deadline = time.time() + 30
                while time.time() < deadline and not os.path.exists(final + ".part"):
                    time.sleep(0.05)
                time.sleep(1.0)
                run.rx.send_signal(signal.SIGKILL)
                run.rx.communicate(timeout=30)
                with h5py.File(final + ".part", "r") as f:  # what the killed gateway acknowledged is in the file
                    before = len(f["/entry/numastream/sequences"])
                time.sleep(0.5)
                run.restart_receiver()
                tx_rc, rx_rc, sent, received = run.stop(until=lambda: os.path.exists(final), timeout=60)
                log = run.log()
                self.assertEqual((tx_rc, rx_rc), (0, 0), log)
                self.assertEqual((received["lost"], received["corrupt"], received["incomplete_files"]), (0, 0, []), log)
                self.assertIn(f"resumed in {final}.part, written by an earlier gateway", log)
                series = received["stream2_series"]
                self.assertEqual([(s["file"], s["complete"], s["images"]) for s in series], [(final, True, images)], log)
                self.assertEqual(sorted(f for f in os.listdir(self.tmp) if f.startswith(case + "_")),
                                 [os.path.basename(final)], "one file for the series")
                if case == "eiger2":
                    self.assertSeriesFile(final, messages, series_id, messages[0]["series_unique_id"], "32008")
                else:
                    src = os.path.join(self.tmp, "src.raw")
                    subprocess.run([AGENT, "synth", "--out", src, "--chunk-bytes", str(64 * 100 * 2), "--width", "100",
                                    "--frames", str(images + 5), "--seed", "11"], check=True, capture_output=True)
                    proj = np.fromfile(src, dtype="<u2").reshape(images + 5, 64, 100)
                    with h5py.File(final, "r") as f:
                        for c, name in enumerate(("t1", "t2")):
                            ds = f[f"/entry/data/{name}"]
                            self.assertEqual(ds.shape, (images, 64, 100))
                            for i in range(images):
                                np.testing.assert_array_equal(ds[i], proj[i + 5 * c], err_msg=f"{name} {i}")
                print(f"[stream2] {case}: gateway SIGKILL mid-series: {before} messages flushed in the .part, the "
                      f"next gateway reopened it; published complete with {images} images")


def load_cbor(path):
    with open(path, "rb") as f:
        return cbor2.loads(f.read())


def received_all(run):
    """The gateway's log says the series ended (complete or not)."""
    return "INCOMPLETE" in run.log().split("--- receive\n")[-1]


class SeriesWrittenPastThePageCache(SeriesIntoHdf5):
    """Every test above again with sink.io=direct: the series files written with O_DIRECT by the
    agent's own HDF5 driver (this test's directory takes it: checked), read back by h5py."""
    SINK_IO = ["--set", "sink.io=direct"]

    def setUp(self):
        super().setUp()
        probe = os.path.join(self.tmp, ".o_direct_probe")
        try:
            os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600))
            os.unlink(probe)
        except OSError as e:
            self.fail(f"{self.tmp} refuses O_DIRECT ({e}): these tests need a filesystem that takes it")

    def tearDown(self):
        # Every series file the gateways opened, they said they write past the page cache.
        opened = [l for run in getattr(self, "runs", []) for l in run.log().splitlines()
                  if "hdf5 sink: series" in l and ("->" in l or "resumed" in l)]
        super().tearDown()
        for line in opened:
            self.assertIn("(direct I/O: past the page cache)", line)


if __name__ == "__main__":
    unittest.main()
