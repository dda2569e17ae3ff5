"""The gateway's live preview, seen as the people at the experiment see it.

A real sender and gateway on loopback (preview.enabled); the pictures fetched from the gateway are
decoded by Pillow and held against the same frame rendered here with numpy (binned means, the log
colour scale, masked pixels green) from pixels the reference libraries decoded: a synthetic
pattern sent bslz4-compressed, and the real EIGER2 recordings through a Stream V2 gateway. Then
the /preview page in Debian's headless Chromium: the screenshot shows the pattern (its masked
corner, the two halves' colours) and the page names the stream and its frame size.

Run: NUMASTREAM_AGENT=bin/numastream-agent $(hack/pyenv.sh) test/codec/preview_test.py
"""
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import cbor2
import numpy as np
from PIL import Image

from realdata import AGENT, REAL, REQUIRE_REAL
from stream2_hdf5_test import channels_of, free_port

# The colour scale's stops (obs/image.cpp) and the masked pixels' colour.
STOPS = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=float)
MASKED = np.array([0, 255, 0])


def render(frame, max_side=512):
    """What the preview should show: b x b blocks (b the smallest that fits max_side), the mean of
    their unmasked pixels (all bits set: masked), log-scaled from the lowest to the highest mean."""
    rows, cols = frame.shape
    b = max(-(-rows // max_side), -(-cols // max_side))
    masked = frame == np.iinfo(frame.dtype).max
    h, w = -(-rows // b), -(-cols // b)
    values = np.zeros((h * b, w * b))
    counts = np.zeros((h * b, w * b))
    values[:rows, :cols] = np.where(masked, 0, frame)
    counts[:rows, :cols] = ~masked
    sums = values.reshape(h, b, w, b).sum(axis=(1, 3))
    n = counts.reshape(h, b, w, b).sum(axis=(1, 3))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, sums / n, np.nan)
    lo, hi = np.nanmin(mean), np.nanmax(mean)
    span = np.log1p(hi - lo) if hi > lo else 0
    t = np.nan_to_num(np.log1p(mean - lo) / span if span else np.zeros_like(mean), nan=0.0)
    x = np.clip(t, 0, 1) * 4
    i = np.minimum(3, np.floor(x).astype(int))
    f = (x - i)[..., None]
    rgb = np.floor(STOPS[i] + f * (STOPS[i + 1] - STOPS[i]) + 0.5)
    rgb[np.isnan(mean)] = MASKED
    return rgb.astype(np.uint8)


def pattern():
    """256 x 256 uint16: 1 count on the left half, 10000 on the right, a masked 32 x 32 corner."""
    f = np.where(np.arange(256)[None, :] < 128, 1, 10000).astype("<u2").repeat(256, axis=0)
    f[:32, :32] = 0xFFFF
    return f


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read()


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Gateway:
    """A receiver with the preview on its metrics port, and whatever feeds it."""

    def __init__(self, tmp, rx_args=()):
        self.tmp = tmp
        self.data = f"tcp://127.0.0.1:{free_port()}"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.procs = []
        self.rx = self.start("receive", [AGENT, "receive", "--endpoint", self.data, "--metrics-listen",
                                         f"127.0.0.1:{self.port}", "--set", "preview.enabled=true",
                                         "--idle-timeout", "60", *rx_args])

    def start(self, name, argv):
        log = open(os.path.join(self.tmp, name + ".log"), "w+")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs.append((p, log))
        return p

    def log(self):
        out = ""
        for p, f in self.procs:
            f.flush()
            with open(f.name) as r:
                out += f"--- {os.path.basename(f.name)}\n{r.read()}"
        return out

    def streams(self, until, timeout=30):
        """/preview/streams.json once `until(streams)` holds."""
        deadline = time.time() + timeout
        streams = []
        while time.time() < deadline:
            try:
                streams = json.loads(get(self.base + "/preview/streams.json")[2])
                if until(streams):
                    return streams
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"the preview never showed what was awaited: {streams}\n{self.log()}")

    def picture(self, stream=0):
        status, kind, body = get(f"{self.base}/preview/stream/{stream}.png")
        assert (status, kind) == (200, "image/png"), (status, kind)
        return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))

    def stop(self):
        for p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p, f in self.procs:
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            f.close()


class LivePreview(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.gateways = []

    def tearDown(self):
        for g in self.gateways:
            g.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pattern_gateway(self):
        """A sender of the pattern, bslz4-compressed, 20 frames a second for a minute."""
        g = Gateway(self.tmp)
        self.gateways.append(g)
        frames = os.path.join(self.tmp, "frames.raw")
        with open(frames, "wb") as f:
            f.write(pattern().tobytes() * 1200)
        g.start("send", [AGENT, "send", "--endpoint", g.data, "--source", "file", "--source-path", frames,
                         "--chunk-bytes", str(256 * 256 * 2), "--set", "source.shape=[256,256]", "--codec", "bslz4",
                         "--rate-gbps", str(20 * 256 * 256 * 2 * 8 / 1e9)])
        g.streams(lambda s: s and s[0]["generation"] >= 2)
        return g

    def test_the_picture_is_the_frame_binned_and_log_scaled_with_masked_pixels_marked(self):
        g = self.pattern_gateway()
        got = g.picture()
        self.assertEqual(got.shape, (256, 256, 3))
        want = render(pattern())
        self.assertLessEqual(int(np.abs(got.astype(int) - want.astype(int)).max()), 1)
        self.assertTrue((got[:32, :32] == MASKED).all(), "the masked corner is green")
        # Binned to 100 pixels a side: 3 x 3 blocks.
        (s,) = g.streams(lambda s: s)
        self.assertEqual((s["stream"], s["rows"], s["cols"], s["error"]), (0, 256, 256, None))
        self.assertGreater(s["frames"], 0)

    def test_the_page_in_a_real_browser_shows_the_pattern(self):
        browser = chromium()
        if not browser:
            if REQUIRE_REAL:
                self.fail("NUMASTREAM_REQUIRE_REAL=1: Debian's chromium is not installed (hack/install-deps.sh)")
            self.skipTest("Debian's chromium is not installed (hack/install-deps.sh)")
        g = self.pattern_gateway()
        shot = os.path.join(self.tmp, "page.png")
        base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--force-device-scale-factor=1", "--window-size=640,480", "--virtual-time-budget=4000",
                f"--user-data-dir={os.path.join(self.tmp, 'chromium')}"]
        run = subprocess.run(base + [f"--screenshot={shot}", g.base + "/preview"], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        page = np.asarray(Image.open(shot).convert("RGB")).astype(int)
        green = np.argwhere((page == MASKED).all(axis=2))
        self.assertGreater(len(green), 0, "no masked (green) pixels in the screenshot: the picture is not on the page")
        (top, left), (bottom, right) = green.min(axis=0), green.max(axis=0)
        self.assertEqual((bottom - top + 1, right - left + 1), (32, 32), "the masked corner, at 1 screen pixel a pixel")
        low, high = render(pattern())[128, 64], render(pattern())[128, 192]
        self.assertLessEqual(int(np.abs(page[top + 128, left + 64] - low).max()), 2, "left half")
        self.assertLessEqual(int(np.abs(page[top + 128, left + 192] - high).max()), 2, "right half")
        dom = subprocess.run(base + ["--dump-dom", g.base + "/preview"], capture_output=True, text=True, timeout=120)
        self.assertEqual(dom.returncode, 0, dom.stderr)
        self.assertIn("stream 0 \u00b7 chunk ", dom.stdout)
        self.assertIn("256 x 256", dom.stdout)
        self.assertIn("MB/s", dom.stdout)

    def test_real_eiger2_images_through_a_stream_v2_gateway(self):
        folders = ["r500k_bm_bslz4_16bit", "r500k_bm_bslz4_32bit", "r500k_bm_lz4_16bit"]
        if not all(os.path.isdir(os.path.join(REAL, f)) for f in folders):
            if REQUIRE_REAL:
                self.fail(f"NUMASTREAM_REQUIRE_REAL=1: the EIGER2 recordings are not in {REAL}")
            self.skipTest(f"the EIGER2 recordings are not in {REAL}")
        for folder in folders:
            with self.subTest(folder=folder):
                messages = []
                for path in sorted(glob.glob(os.path.join(REAL, folder, "*"))):
                    with open(path, "rb") as f:
                        messages.append(cbor2.loads(f.read()))
                # Each image's threshold_1, decoded by the reference libraries, rendered here.
                wanted = [render(channels_of(m)["threshold_1"][0]) for m in messages if m["type"] == "image"]
                g = Gateway(self.tmp)
                self.gateways.append(g)
                det = f"tcp://127.0.0.1:{free_port()}"
                g.start("sim", [AGENT, "detector-sim", "--endpoint", det, "--linger-s", "60", "--replay",
                                os.path.join(REAL, folder), "--start", "--rate-hz", "4"])
                g.start("send", [AGENT, "send", "--endpoint", g.data, "--source", "stream2", "--source-endpoint", det])
                g.streams(lambda s: s and s[0]["generation"] >= 1)
                got = g.picture()
                self.assertEqual(got.shape, wanted[0].shape)
                diffs = [int(np.abs(got.astype(int) - w.astype(int)).max()) for w in wanted]
                self.assertLessEqual(min(diffs), 1, f"the picture is none of the series' images: {diffs}")
                (s,) = g.streams(lambda s: s)
                self.assertIsNone(s["error"])
                g.stop()
                self.gateways.remove(g)


if __name__ == "__main__":
    unittest.main(verbosity=2)
