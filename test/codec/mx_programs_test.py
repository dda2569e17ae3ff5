"""NXmx series the gateway writes, opened by the field's own programs as a scientist would:
DIALS (Debian's python3-dials: `dials.import`, and dxtbx reading the images), silx (the default
plot), the `nxmx` reader (the geometry), and the fields XDS's HDF5 readers (Durin, Neggia) take,
on the real EIGER2 recordings and on synthetic series (a rotation, stills, several channels, one
cut short).

detector-sim (--goniometer) -> send --source stream2 -> receive --sink hdf5 --sink-layout nxmx.

Run: NUMASTREAM_AGENT=bin/numastream-agent $(hack/pyenv.sh) test/codec/mx_programs_test.py
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle and LZ4 filters with h5py)
import numpy as np

import nxmx
import silx.io.nxdata

from realdata import REQUIRE_REAL, recording
from stream2_hdf5_test import Series, channels_of, load_cbor

HERE = os.path.dirname(os.path.abspath(__file__))
# DIALS lives in Debian's python3, not in the oracle virtualenv.
DIALS_PYTHON = "/usr/bin/python3"

# What XDS's HDF5 readers open in a master file, read from their public sources:
#   Neggia (dectris/neggia, src/dectris/neggia/plugin/H5ToXds.cpp) and
#   Durin (DiamondLightSource/durin, src/file.c).
# path -> (the reader that needs it, what it must be)
XDS_READERS = {
    "/entry/instrument/detector/x_pixel_size": ("Neggia, Durin", "scalar float, units"),
    "/entry/instrument/detector/y_pixel_size": ("Neggia, Durin", "scalar float, units"),
    "/entry/instrument/detector/detectorSpecific/pixel_mask": ("Neggia", "2-d integer, the image's shape"),
    "/entry/instrument/detector/pixel_mask": ("Durin", "2-d integer, the image's shape"),
    "/entry/instrument/detector/detectorSpecific/nimages": ("Neggia", "scalar unsigned integer > 0"),
    "/entry/instrument/detector/detectorSpecific/ntrigger": ("Neggia", "scalar unsigned integer > 0"),
    "/entry/data/data_000001": ("Neggia, Durin", "3-d integer, one image per chunk"),
}


def dials_available():
    return shutil.which("dials.import") is not None and os.path.exists(DIALS_PYTHON)


def decoded_images(folder):
    """{image_id: {channel: pixels}} of a recording, decoded by the reference libraries."""
    out = {}
    for p in sorted(glob.glob(os.path.join(folder, "*"))):
        m = load_cbor(p)
        if m["type"] == "image":
            out[m["image_id"]] = {name: pixels for name, (pixels, _, _) in channels_of(m).items()}
    return out


def image_times(folder):
    """{image_id: (start_time, stop_time, real_time)} of a recording, in seconds (the rationals
    each image message carries)."""
    out = {}
    for p in sorted(glob.glob(os.path.join(folder, "*"))):
        m = load_cbor(p)
        if m["type"] == "image":
            out[m["image_id"]] = tuple(m[k][0] / m[k][1] for k in ("start_time", "stop_time", "real_time"))
    return out


class SeriesOpenedByTheFieldsPrograms(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.tmp])

    def need_dials(self):
        if not dials_available():
            if REQUIRE_REAL:
                self.fail("NUMASTREAM_REQUIRE_REAL=1: DIALS is not installed (hack/install-deps.sh installs "
                          "python3-dials)")
            self.skipTest("DIALS is not installed (Debian's python3-dials)")

    def write_series(self, sim_args, name="s", per_file=4, until_complete=True):
        """A detector-sim series through a sender and a gateway into NXmx files; the master's path."""
        master = os.path.join(self.tmp, f"{name}_1_master.h5")
        run = Series(self.tmp, sim_args, os.path.join(self.tmp, name + "_{series}.h5"),
                     rx_args=["--sink-layout", "nxmx", "--frames-per-file", str(per_file)])
        done = (lambda: f"complete: {master}" in run.log()) if until_complete else (lambda: "INCOMPLETE" in run.log())
        tx_rc, rx_rc, _, received = run.stop(until=done)
        self.log = run.log()
        if until_complete:
            self.assertEqual((tx_rc, rx_rc), (0, 0), self.log)
        return master, received

    def dials_import(self, master, images=""):
        """`dials.import` on `master` (its summary lines), then what dxtbx made of it (dials_probe.py)."""
        out = os.path.join(self.tmp, "dials")
        os.makedirs(out, exist_ok=True)
        run = subprocess.run(["dials.import", master, f"output.experiments={out}/imported.expt",
                              f"output.log={out}/dials.import.log"], cwd=out, capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(run.returncode, 0, f"dials.import {master}:\n{run.stdout}\n{run.stderr}")
        summary = [line.strip() for line in run.stdout.splitlines() if ":" in line and line.startswith("  ")]
        probe = subprocess.run([DIALS_PYTHON, os.path.join(HERE, "dials_probe.py"), f"{out}/imported.expt",
                                "--images", images, "--out", out], capture_output=True, text=True, timeout=300)
        self.assertEqual(probe.returncode, 0, probe.stderr)
        self.dials_out = out
        return summary, json.loads(probe.stdout.strip().splitlines()[-1])

    def dials_pixels(self, i):
        return np.load(os.path.join(self.dials_out, f"image_{i}.npy")), np.load(
            os.path.join(self.dials_out, f"mask_{i}.npy"))

    def assertOneSweep(self, summary, got, images, start, increment):
        self.assertIn("sweep:    1", summary, summary)
        self.assertIn("still:    0", summary, summary)
        self.assertEqual(len(got["imagesets"]), 1, got)
        s = got["imagesets"][0]
        self.assertEqual((s["kind"], s["images"], s["image_range"]), ("sweep", images, [1, images]), s)
        np.testing.assert_allclose(s["oscillation"], [start, increment])
        np.testing.assert_allclose(s["rotation_axis"], [1, 0, 0], err_msg="omega about -x (McStas) is +x in imgCIF")
        return s

    def assertGeometryOfTheStart(self, s, rows, cols):
        """What detector-sim's start message says: 1 A, 120 mm (detector_translation), 75 um
        pixels, the beam centre at the image's centre, a 450 um Si sensor."""
        self.assertAlmostEqual(s["wavelength"], 1.0, places=6)
        self.assertAlmostEqual(s["distance_mm"], 120.0, places=6)
        np.testing.assert_allclose(s["pixel_size_mm"], [0.075, 0.075])
        self.assertEqual(s["image_size"], [cols, rows])
        np.testing.assert_allclose(s["beam_centre_px"], [cols / 2, rows / 2], atol=1e-6)
        self.assertEqual((s["material"], round(s["thickness_mm"], 6)), ("Si", 0.45))

    def assertXdsReadersFindTheirFields(self, f, rows, cols):
        problems = []
        for path, (who, what) in XDS_READERS.items():
            if path not in f:
                problems.append(f"{path} ({who}): missing")
                continue
            d = f[path]
            if "units" in what and "units" not in d.attrs:
                problems.append(f"{path} ({who}): no units")
            if what.startswith("2-d") and (d.ndim != 2 or d.shape != (rows, cols) or d.dtype.kind not in "iu"):
                problems.append(f"{path} ({who}): {d.shape} {d.dtype}, not {what}")
            if what.startswith("scalar unsigned") and (d.shape != () or d.dtype.kind != "u" or d[()] == 0):
                problems.append(f"{path} ({who}): {d.shape} {d.dtype}, not {what}")
            if what.startswith("3-d") and (d.ndim != 3 or d.chunks != (1, rows, cols) or d.dtype.kind not in "iu"):
                problems.append(f"{path} ({who}): {d.shape} chunks {d.chunks} {d.dtype}, not {what}")
        self.assertEqual(problems, [], "the master holds what XDS's readers open")

    def assertSilxFindsTheDefaultPlot(self, f, images, rows, cols):
        nxd = silx.io.nxdata.get_default(f)
        self.assertIsNotNone(nxd, "silx finds a default NXdata through @default")
        self.assertTrue(nxd.is_valid, nxd.issues if hasattr(nxd, "issues") else "")
        self.assertEqual(nxd.signal.shape, (images, rows, cols))
        self.assertEqual(nxd.interpretation, "image")

    def test_real_eiger2_series_imported_by_dials_as_one_sweep_with_the_detectors_pixels(self):
        self.need_dials()
        base = self.tmp
        for name in ("r500k_bm_bslz4_16bit", "r500k_bm_bslz4_32bit", "r500k_bm_bslz4_8bit", "r500k_bm_lz4_16bit"):
            with self.subTest(recording=name):
                folder = recording(self, name)
                self.tmp = os.path.join(base, name)
                os.makedirs(self.tmp)
                want = decoded_images(folder)
                master, _ = self.write_series(["--replay", folder, "--start", "--goniometer", "omega=10,0.5"],
                                              name=name)
                summary, got = self.dials_import(master, images="0,9")
                s = self.assertOneSweep(summary, got, 10, 10.0, 0.5)
                self.assertGeometryOfTheStart(s, 514, 1030)
                with h5py.File(master, "r") as f:
                    channels = [c.decode() if isinstance(c, bytes) else c
                                for c in f["/entry/instrument/detector/detectorSpecific/channels"][()]]
                    first = channels[0]
                    self.assertXdsReadersFindTheirFields(f, 514, 1030)
                    self.assertSilxFindsTheDefaultPlot(f, 10, 514, 1030)
                    for c in channels:
                        for i in (0, 9):
                            np.testing.assert_array_equal(f[f"/entry/data/{c}"][i], want[i][c], err_msg=f"{c} {i}")
                    entry = nxmx.NXmx(f).entries[0]  # the nxmx package's reading of the geometry
                    chain = nxmx.get_dependency_chain(entry.samples[0].depends_on)
                    self.assertEqual([(t.path, t.transformation_type) for t in chain],
                                     [("/entry/sample/transformations/omega", "rotation")])
                    np.testing.assert_allclose(chain[0][()].to("deg").magnitude, 10 + 0.5 * np.arange(10))
                    module = entry.instruments[0].detectors[0].modules[0]
                    self.assertEqual(list(module.data_size), [514, 1030])
                    self.assertAlmostEqual(entry.instruments[0].beams[0].incident_wavelength.to("angstrom").magnitude,
                                           1.0)
                    det = f["/entry/instrument/detector"]
                    times = image_times(folder)
                    for k, field in enumerate(("start_time", "stop_time", "real_time")):
                        self.assertEqual(det[field].attrs["units"], "s")
                        np.testing.assert_allclose(det[field][()], [times[i][k] for i in range(10)],
                                                   err_msg=f"{field}: each image message's, in seconds")
                for i in (0, 9):
                    pixels, _ = self.dials_pixels(i)
                    # dxtbx reads pixels as int32 and gives the readout depth's all-ones as -1, the one
                    # below as -2 (2^31 - 1 and - 2 at 32 bits): what it flags as no data
                    raw = want[i][first]
                    bits = 8 * raw.dtype.itemsize
                    expect = raw.astype(np.int32).astype(np.int64) if bits == 32 else raw.astype(np.int64)
                    top = 2 ** 31 if bits == 32 else 2 ** bits
                    expect[expect == top - 1] = -1
                    expect[expect == top - 2] = -2
                    np.testing.assert_array_equal(pixels.astype(np.int64), expect, err_msg=f"{name} image {i}")
                self.tmp = base
                print(f"[mx] {name}: dials.import: {', '.join(summary)}; oscillation {s['oscillation']}, "
                      f"distance {s['distance_mm']} mm, beam centre {s['beam_centre_px']} px; images 0 and 9 "
                      "read by dxtbx equal the detector's")

    def test_a_synthetic_rotation_of_two_uint32_channels_imports_as_one_sweep_with_its_mask(self):
        self.need_dials()
        master, _ = self.write_series(["--synthetic", "--images", "10", "--shape", "64x100", "--channels", "a,b",
                                       "--dtype", "uint32", "--goniometer", "omega=-5,0.1"])
        summary, got = self.dials_import(master, images="0,9")
        s = self.assertOneSweep(summary, got, 10, -5.0, 0.1)
        self.assertGeometryOfTheStart(s, 64, 100)
        self.assertEqual(s["trusted_range"][1], 2 ** 32 - 2, "the start message's saturation_value")
        pixels, mask = self.dials_pixels(9)
        self.assertFalse(mask[0, 0], "pixel (0, 0) is a gap in the start message's pixel mask")
        self.assertTrue(mask[1:, 1:].all())
        with h5py.File(master, "r") as f:
            np.testing.assert_array_equal(pixels, f["/entry/data/a"][9].astype(np.int64))
            self.assertFalse(np.array_equal(f["/entry/data/a"][9], f["/entry/data/b"][9]), "two channels, two stacks")
            self.assertXdsReadersFindTheirFields(f, 64, 100)
            self.assertSilxFindsTheDefaultPlot(f, 10, 64, 100)
            det = f["/entry/instrument/detector"]
            self.assertEqual((int(det["bit_depth_image"][()]), int(det["saturation_value"][()])), (32, 2 ** 32 - 2))
            np.testing.assert_allclose(f["/entry/sample/transformations/omega"][()], -5 + 0.1 * np.arange(10))
            np.testing.assert_allclose(f["/entry/sample/transformations/omega_end"][()], -4.9 + 0.1 * np.arange(10))

            # The nxmx package (what dxtbx's NXmx reading became) reads the same geometry.
            entry = nxmx.NXmx(f).entries[0]
            chain = nxmx.get_dependency_chain(entry.samples[0].depends_on)
            self.assertEqual([t.path for t in chain], ["/entry/sample/transformations/omega"])
            self.assertEqual(chain[0].transformation_type, "rotation")
            np.testing.assert_allclose(chain[0].vector, [-1, 0, 0])
            detector = entry.instruments[0].detectors[0]
            module = detector.modules[0]
            self.assertEqual(list(module.data_size), [64, 100])
            self.assertAlmostEqual(module.fast_pixel_direction[()].to("mm").magnitude.item(), 0.075)
            origin = nxmx.get_cumulative_transformation(nxmx.get_dependency_chain(module.fast_pixel_direction.depends_on))
            np.testing.assert_allclose(origin[0, :3, 3], [100 / 2 * 0.075, 64 / 2 * 0.075, 120],
                                       err_msg="mm: the beam centre's pixel on the beam, 120 mm downstream")
        print(f"[mx] synthetic rotation, uint32 x 2 channels: dials.import: {', '.join(summary)}; oscillation "
              f"{s['oscillation']}, trusted range {s['trusted_range']}; the gap pixel masked")

    def test_dials_finds_the_spots_planted_in_a_synthetic_rotation(self):
        self.need_dials()
        rows, cols, images = 128, 160, 10
        rng = np.random.default_rng(2026)
        planted = []
        while len(planted) < 12:
            x, y, z = int(rng.integers(8, cols - 8)), int(rng.integers(8, rows - 8)), int(rng.integers(1, images - 1))
            if all(abs(x - a) > 8 or abs(y - b) > 8 or abs(z - c) > 3 for a, b, c in planted):
                planted.append((x, y, z))
        spots = os.path.join(self.tmp, "spots.txt")
        with open(spots, "w") as f:
            f.writelines(f"{x} {y} {z}\n" for x, y, z in planted)
        master, _ = self.write_series(["--synthetic", "--images", str(images), "--shape", f"{rows}x{cols}",
                                       "--goniometer", "omega=0,0.5", "--spots", spots])
        self.dials_import(master)
        run = subprocess.run(["dials.find_spots", "imported.expt", "nproc=1"], cwd=self.dials_out, capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        probe = subprocess.run([DIALS_PYTHON, os.path.join(HERE, "dials_probe.py"), f"{self.dials_out}/imported.expt",
                                "--spots", f"{self.dials_out}/strong.refl"], capture_output=True, text=True, timeout=300)
        self.assertEqual(probe.returncode, 0, probe.stderr)
        found = json.loads(probe.stdout.strip().splitlines()[-1])["spots"]
        self.assertEqual(len(found), len(planted), f"dials.find_spots found {found}, planted {planted}")
        for x, y, z in planted:
            # DIALS's pixel i spans [i, i + 1): a spot centred on pixel (x, y) of image z is at
            # (x + 0.5, y + 0.5, z + 0.5).
            near = [s for s in found if abs(s[0] - x - 0.5) < 0.5 and abs(s[1] - y - 0.5) < 0.5 and abs(s[2] - z - 0.5) < 0.6]
            self.assertEqual(len(near), 1, f"planted ({x}, {y}) on image {z}: found {found}")
        print(f"[mx] dials.find_spots on a synthetic rotation ({rows}x{cols}, {images} images): {len(found)} spots "
              f"found, each within half a pixel of one of the {len(planted)} planted")

    def test_a_series_of_stills_imports_as_stills(self):
        self.need_dials()
        master, _ = self.write_series(["--synthetic", "--images", "6", "--shape", "64x100",
                                       "--goniometer", "omega=30,0"])
        summary, got = self.dials_import(master)
        self.assertIn("sweep:    0", summary, summary)
        # DIALS keeps each still as an experiment of its own.
        self.assertEqual([(s["kind"], s["images"]) for s in got["imagesets"]], [("stills", 1)] * 6, got)
        with h5py.File(master, "r") as f:
            self.assertEqual(f["/entry/sample/depends_on"][()].decode(), ".")
        print(f"[mx] stills (omega increment 0): dials.import: {', '.join(summary)}")

    def test_a_series_cut_short_still_imports_naming_what_it_holds(self):
        self.need_dials()
        # The detector never sends images 5-7: the gateway gives the series up, data file 2 stays .part.
        master, received = self.write_series(["--synthetic", "--images", "12", "--shape", "64x100", "--seed", "3",
                                              "--goniometer", "omega=0,1", "--drop-images", "5-7"],
                                             until_complete=False)
        self.assertIn("image ids 5-7 missing (3 of 12)", received["stream2_series"][0]["lacks"], self.log)
        summary, got = self.dials_import(master, images="4,5,8")
        self.assertOneSweep(summary, got, 12, 0.0, 1.0)
        with h5py.File(master, "r") as f:
            self.assertIn("image ids 5-7 missing (3 of 12)", f["/entry"].attrs["incomplete"])
            stack = f["/entry/data/data"]
            with h5py.File(os.path.join(self.tmp, "s_1_data_000002.h5.part"), "r") as part:
                np.testing.assert_array_equal(stack[4], part["/entry/data/data"][0],
                                              "image 4, in the .part the series left, read through the master")
            np.testing.assert_array_equal(stack[5], np.full((64, 100), 0xFFFF, np.uint16), "image 5: no data")
            start = f["/entry/instrument/detector/start_time"][()]
            self.assertEqual(len(start), 12)
            self.assertTrue(np.isnan(start[5:8]).all(), f"no time for images never sent: {start}")
            np.testing.assert_allclose(start[[0, 4, 8, 11]], [0, 0.004, 0.008, 0.011], err_msg="1 ms images")
        held, _ = self.dials_pixels(4)
        missing, _ = self.dials_pixels(5)
        self.assertGreater(held.max(), 0)
        self.assertTrue((missing == -1).all(), "DIALS reads an image the series lacks as masked (no data)")
        print(f"[mx] a series cut short (images 5-7 never sent): dials.import: {', '.join(summary)}; image 4 read "
              "from the .part, image 5 all no-data (masked)")

    def test_a_master_whose_gateway_was_killed_imports_while_the_series_is_unfinished(self):
        self.need_dials()
        run = Series(self.tmp, ["--synthetic", "--images", "40", "--shape", "64x100", "--rate-hz", "20",
                                "--goniometer", "omega=0,0.25"], os.path.join(self.tmp, "k_{series}.h5"),
                     rx_args=["--sink-layout", "nxmx", "--frames-per-file", "4"])
        first = os.path.join(self.tmp, "k_1_data_000002.h5")
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(first):
            time.sleep(0.05)
        for p in (run.rx, run.tx, run.sim):  # the gateway killed; the sender and detector then stopped
            p.send_signal(signal.SIGKILL)
            p.communicate(timeout=30)
        for f in run.logs.values():
            f.close()
        master = os.path.join(self.tmp, "k_1_master.h5")
        summary, got = self.dials_import(master, images="0,39")
        self.assertOneSweep(summary, got, 40, 0.0, 0.25)
        held, _ = self.dials_pixels(0)
        later, _ = self.dials_pixels(39)
        self.assertGreater(held.max(), 0, "image 0, in a published data file")
        self.assertTrue((later == -1).all(), "image 39, not written yet: no data")
        print(f"[mx] a gateway killed mid-series: dials.import of the master: {', '.join(summary)}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
