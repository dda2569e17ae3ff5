"""Stream V2 series through real agents into NXmx master and data files (sink.layout "nxmx"),
read back by h5py + hdf5plugin through the master's links, held against the detector's own
messages (cbor2, bitshuffle) and against NeXus's own NXmx definition (test/codec/nxdl.py).

detector-sim (the real EIGER2 R 500K recordings, or synthetic series) -> send --source stream2
-> receive --sink hdf5 --sink-layout nxmx --frames-per-file N.

Run: NUMASTREAM_AGENT=bin/numastream-agent $(hack/pyenv.sh) test/codec/nxmx_test.py
"""
import datetime
import glob
import os
import signal
import subprocess
import tempfile
import time
import unittest

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle and LZ4 filters with h5py)
import numpy as np

import nxdl
from realdata import AGENT, recording
from stream2_hdf5_test import Series, channels_of, load_cbor

NAMES = ["--instrument", "BL-TEST (facility in a box)", "--source-name", "numastream test source",
         "--sample", "lysozyme"]


def nxmx_args(frames_per_file):
    return ["--sink-layout", "nxmx", "--frames-per-file", str(frames_per_file), *NAMES]


def text(value):
    return value.decode() if isinstance(value, bytes) else value


class SeriesIntoNxmxFiles(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.tmp])

    def recording(self, name):
        return recording(self, name)

    def synthetic_pixels(self, images, seed, channels=1, shape=(64, 100)):
        """The simulator's synthetic images: image i of channel c is projection i + 5 * c of
        `numastream-agent synth` over the series' images + 5 * (channels - 1) projections."""
        src = os.path.join(self.tmp, "src.raw")
        frames = images + 5 * (channels - 1)
        subprocess.run([AGENT, "synth", "--out", src, "--chunk-bytes", str(shape[0] * shape[1] * 2), "--width",
                        str(shape[1]), "--frames", str(frames), "--seed", str(seed)], check=True, capture_output=True)
        return np.fromfile(src, dtype="<u2").reshape(frames, *shape)

    def files(self, prefix):
        return sorted(f for f in os.listdir(self.tmp) if f.startswith(prefix))

    def assertNxmx(self, f):
        self.assertEqual(nxdl.problems(f, "NXmx"), [], "the master meets NeXus's NXmx definition")
        self.assertEqual(text(f["/entry/definition"][()]), "NXmx")
        self.assertEqual(text(f["/entry/instrument/name"][()]), NAMES[1])
        self.assertEqual(text(f["/entry/source/name"][()]), NAMES[3])
        self.assertEqual(text(f["/entry/sample/name"][()]), NAMES[5])

    def test_real_eiger2_series_into_a_master_and_data_files_of_four_images(self):
        folder = self.recording("r500k_bm_bslz4_16bit")
        messages = [load_cbor(p) for p in sorted(glob.glob(os.path.join(folder, "*")))]
        images = [m for m in messages if m["type"] == "image"]
        series_id = messages[0]["series_id"]
        master = os.path.join(self.tmp, f"eiger2_{series_id}_master.h5")
        run = Series(self.tmp, ["--replay", folder, "--start"], os.path.join(self.tmp, "eiger2_{series}.h5"),
                     rx_args=nxmx_args(4))
        tx_rc, rx_rc, sent, received = run.stop(until=lambda: f"complete: {master}" in run.log())
        log = run.log()
        self.assertEqual((tx_rc, rx_rc), (0, 0), log)
        self.assertEqual((received["lost"], received["corrupt"], received["incomplete_files"]), (0, 0, []), log)
        self.assertEqual([(s["file"], s["complete"], s["images"]) for s in received["stream2_series"]],
                         [(master, True, 10)], log)
        prefix = f"eiger2_{series_id}"
        self.assertEqual(self.files(prefix), [f"{prefix}_data_00000{k}.h5" for k in (1, 2, 3)] + [f"{prefix}_master.h5"],
                         "three data files (4 + 4 + 2 images), published, and the master")
        with h5py.File(master, "r") as f:
            self.assertNxmx(f)
            self.assertIn("end_time", f["/entry"], "a complete series has its end time")
            self.assertNotIn("incomplete", f["/entry"].attrs)
            series_date = images[0]["series_date"]
            start = datetime.datetime.fromisoformat(text(f["/entry/start_time"][()]).replace("Z", "+00:00"))
            self.assertEqual(start, series_date, "start_time: the detector's date (the replayed start's arm_date)")
            det = f["/entry/instrument/detector"]
            self.assertEqual(list(det["module/data_size"][()]), [514, 1030])
            self.assertEqual(text(det["sensor_material"][()]), "Si")
            self.assertEqual(text(det["sensor_thickness"].attrs["units"]), "m")
            self.assertEqual([k for k in f["/entry/data"] if k.startswith("data_")],
                             ["data_000001", "data_000002", "data_000003"])
            for k, n in ((1, 4), (2, 4), (3, 2)):
                ds = f[f"/entry/data/data_{k:06d}"]
                self.assertEqual(ds.shape, (n, 514, 1030))
                self.assertEqual((int(ds.attrs["image_nr_low"]), int(ds.attrs["image_nr_high"])),
                                 ((k - 1) * 4 + 1, (k - 1) * 4 + n))
            for m in images:
                i = m["image_id"]
                k, at = i // 4 + 1, i % 4
                for c, (name, (pixels, data, algorithm)) in enumerate(channels_of(m).items()):
                    ds = f[f"/entry/data/{name}_{k:06d}"]
                    self.assertIn("32008", ds._filters)
                    mask, stored = ds.id.read_direct_chunk((at, 0, 0))
                    self.assertEqual((mask, stored), (0, data), f"{name} image {i}: the chunk is the detector's bytes")
                    np.testing.assert_array_equal(ds[at], pixels, err_msg=f"{name} image {i}")
                    if c == 0:
                        np.testing.assert_array_equal(f[f"/entry/data/data_{k:06d}"][at], pixels)
        print(f"[nxmx] real EIGER2 series {series_id}: master + 3 data files, 10 images x 3 channels byte-identical; "
              "NXmx definition: no problem")

    def test_a_reader_opens_the_master_and_reads_whole_data_files_while_the_series_runs(self):
        frames, per_file = 48, 8
        proj = self.synthetic_pixels(frames, seed=7)
        master = os.path.join(self.tmp, "live_1_master.h5")
        run = Series(self.tmp, ["--synthetic", "--images", str(frames), "--shape", "64x100", "--channels", "t1",
                                "--seed", "7", "--rate-hz", "16"], os.path.join(self.tmp, "live_{series}.h5"),
                     rx_args=nxmx_args(per_file))
        seen_during, looks, problems = set(), 0, []
        deadline = time.time() + 60
        while time.time() < deadline and f"complete: {master}" not in run.log():
            if os.path.exists(master):
                with h5py.File(master, "r") as f:
                    running = "end_time" not in f["/entry"]
                    looks += 1
                    problems += nxdl.problems(f, "NXmx")
                    self.assertEqual(len([k for k in f["/entry/data"] if k.startswith("data_")]), frames // per_file,
                                     "every data file is linked from the start")
                    for k in range(1, frames // per_file + 1):
                        try:
                            ds = f[f"/entry/data/data_{k:06d}"]
                        except KeyError:  # not written whole yet
                            continue
                        self.assertEqual(ds.shape[0], per_file, "a data file appears only whole")
                        np.testing.assert_array_equal(ds[()], proj[(k - 1) * per_file:k * per_file])
                        if running:
                            seen_during.add(k)
            time.sleep(0.1)
        tx_rc, rx_rc, sent, received = run.stop(until=lambda: True)
        log = run.log()
        self.assertEqual((tx_rc, rx_rc), (0, 0), log)
        self.assertEqual(problems, [], "the master meets NXmx at every look")
        self.assertGreaterEqual(len(seen_during), 2, f"whole data files read while the series ran: {seen_during}\n{log}")
        with h5py.File(master, "r") as f:
            self.assertNxmx(f)
            for k in range(1, frames // per_file + 1):
                np.testing.assert_array_equal(f[f"/entry/data/data_{k:06d}"][()], proj[(k - 1) * per_file:k * per_file])
        print(f"[nxmx] 48 images at 16/s in data files of 8: the master opened {looks} times while it grew; "
              f"data files {sorted(seen_during)} read whole before the series' end")

    def test_a_gateway_killed_mid_series_goes_on_writing_the_same_master_and_data_files(self):
        frames, per_file = 60, 8
        proj = self.synthetic_pixels(frames, seed=11, channels=2)
        master = os.path.join(self.tmp, "kill_1_master.h5")
        run = Series(self.tmp, ["--synthetic", "--images", str(frames), "--shape", "64x100", "--channels", "t1,t2",
                                "--seed", "11", "--rate-hz", "20"], os.path.join(self.tmp, "kill_{series}.h5"),
                     rx_args=nxmx_args(per_file))
        first = os.path.join(self.tmp, "kill_1_data_000001.h5")
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(first):
            time.sleep(0.05)
        time.sleep(0.7)
        run.rx.send_signal(signal.SIGKILL)
        run.rx.communicate(timeout=30)
        left = self.files("kill_1_")
        self.assertIn("kill_1_data_000001.h5", left)
        time.sleep(0.5)
        run.restart_receiver()
        tx_rc, rx_rc, sent, received = run.stop(until=lambda: f"complete: {master}" in run.log(), timeout=60)
        log = run.log()
        self.assertEqual((tx_rc, rx_rc), (0, 0), log)
        self.assertEqual((received["lost"], received["corrupt"], received["incomplete_files"]), (0, 0, []), log)
        self.assertIn(f"resumed in {master}, written by an earlier gateway", log)
        self.assertEqual([(s["file"], s["complete"], s["images"]) for s in received["stream2_series"]],
                         [(master, True, frames)], log)
        self.assertEqual(self.files("kill_1_"), [f"kill_1_data_{k:06d}.h5" for k in range(1, 9)] + ["kill_1_master.h5"],
                         "one master and 8 whole data files: nothing written twice or left .part")
        with h5py.File(master, "r") as f:
            self.assertNxmx(f)
            for c, name in enumerate(("t1", "t2")):
                got = np.concatenate([f[f"/entry/data/{name}_{k:06d}"][()] for k in range(1, 9)])
                np.testing.assert_array_equal(got, proj[5 * c:5 * c + frames], err_msg=name)
        print(f"[nxmx] gateway SIGKILL mid-series with {left} on disk: the next gateway went on; "
              f"{frames} images in 8 data files, every one the detector's")

    def test_images_the_detector_never_sent_leave_their_data_file_unfinished_and_named_in_the_master(self):
        proj = self.synthetic_pixels(20, seed=3)
        master = os.path.join(self.tmp, "gap_1_master.h5")
        run = Series(self.tmp, ["--synthetic", "--images", "20", "--shape", "64x100", "--channels", "t1", "--seed", "3",
                                "--drop-images", "5-7"], os.path.join(self.tmp, "gap_{series}.h5"),
                     rx_args=nxmx_args(4))
        tx_rc, rx_rc, sent, received = run.stop(until=lambda: "INCOMPLETE" in run.log())
        log = run.log()
        self.assertNotEqual(rx_rc, 0, "a series left incomplete fails the gateway's run:\n" + log)
        series = received["stream2_series"]
        self.assertEqual([(s["file"], s["complete"]) for s in series], [(master, False)], log)
        self.assertIn("image ids 5-7 missing (3 of 20)", series[0]["lacks"])
        self.assertEqual(self.files("gap_1_"), ["gap_1_data_000001.h5", "gap_1_data_000002.h5.part",
                                                "gap_1_data_000003.h5", "gap_1_data_000004.h5", "gap_1_data_000005.h5",
                                                "gap_1_master.h5"], "the data file lacking images 5-7 stays .part")
        with h5py.File(master, "r") as f:
            self.assertIn("image ids 5-7 missing (3 of 20)", text(f["/entry"].attrs["incomplete"]))
            self.assertNotIn("end_time", f["/entry"])
            self.assertNxmx(f)
            with self.assertRaises(KeyError):
                f["/entry/data/data_000002"]  # never published under its final name
            np.testing.assert_array_equal(f["/entry/data/data_000003"][()], proj[8:12])
        with h5py.File(os.path.join(self.tmp, "gap_1_data_000002.h5.part"), "r") as f:
            self.assertIn("image ids 5-7 missing", text(f["/entry"].attrs["incomplete"]))
            np.testing.assert_array_equal(f["/entry/data/data"][0], proj[4])


if __name__ == "__main__":
    unittest.main(verbosity=2)
