"""numastream's bslz4 held against the reference implementations.

The agent's `codec` command encodes and decodes; the reference `bitshuffle` package (PyPI, the
library the HDF5 filter 32008 and DECTRIS detectors use) is the oracle. Real detector frames are the
EIGER2 Stream V2 recordings in ../shared/data/dectris-stream-v2 (CBOR read with cbor2).

Run: NUMASTREAM_AGENT=bin/numastream-agent $(hack/pyenv.sh) -m unittest -v test/codec/oracle_test.py
"""
import glob
import os
import struct
import subprocess
import tempfile
import unittest

import bitshuffle
import cbor2
import numpy as np

from realdata import AGENT, REAL, REQUIRE_REAL, TYPED_ARRAY


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def agent(*args, check=True):
    p = subprocess.run([AGENT, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"numastream-agent {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def reference_encode(pixels):
    """The HDF5 filter's bytes: u64 BE raw size, u32 BE block bytes, the library's blocks."""
    block = bitshuffle.default_block_size(pixels.dtype.itemsize) if hasattr(bitshuffle, "default_block_size") \
        else max(128, (8192 // pixels.dtype.itemsize) // 8 * 8)
    body = bitshuffle.compress_lz4(pixels, 0).tobytes()
    return struct.pack(">QI", pixels.nbytes, block * pixels.dtype.itemsize) + body


def reference_decode(framed, dtype):
    raw_bytes, block_bytes = struct.unpack(">QI", framed[:12])
    n = raw_bytes // np.dtype(dtype).itemsize
    body = np.frombuffer(framed[12:], dtype=np.uint8)
    return bitshuffle.decompress_lz4(body, (n,), np.dtype(dtype), block_bytes // np.dtype(dtype).itemsize)


def real_frames(folder):
    """(name, algorithm, element size, dtype, bytes) of every channel of every image message."""
    out = []
    for path in sorted(glob.glob(os.path.join(REAL, folder, "*.cbor"))):
        msg = cbor2.loads(read(path))
        if msg.get("type") != "image":
            continue
        for channel, arr in msg["data"].items():
            assert arr.tag == 40, f"{path} {channel}: not a multi-dimensional array"
            shape, typed = arr.value
            compressed = typed.value
            assert compressed.tag == 56500, f"{path} {channel}: not compressed"
            algorithm, elem, data = compressed.value
            out.append((f"{os.path.basename(path)}:{channel}", algorithm, elem, TYPED_ARRAY[typed.tag], bytes(data),
                        tuple(shape)))
    return out


class Bslz4AgainstTheReference(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def encode(self, pixels):
        raw = self.path("raw")
        pixels.tofile(raw)
        agent("codec", "encode", "--codec", "bslz4", "--element-size", str(pixels.dtype.itemsize), raw, self.path("enc"))
        return read(self.path("enc"))

    def decode(self, framed, elem):
        write(self.path("in"), framed)
        p = agent("codec", "decode", "--codec", "bslz4", "--element-size", str(elem), self.path("in"),
                  self.path("out"), check=False)
        return p, (read(self.path("out")) if p.returncode == 0 else None)

    def test_synthetic_projections_encode_bit_exact(self):
        agent("synth", "--out", self.path("proj"), "--chunk-bytes", str(2 * 512 * 700), "--width", "512",
              "--frames", "3")
        frames = np.fromfile(self.path("proj"), dtype="<u2").reshape(3, -1)
        for i, f in enumerate(frames):
            for pixels in (f, (f >> 4).astype(np.uint8), f.astype("<u4") * 3, f[: f.size - 5]):
                with self.subTest(frame=i, dtype=str(pixels.dtype), n=pixels.size):
                    ours = self.encode(pixels)
                    self.assertEqual(ours, reference_encode(pixels), "bslz4 bytes differ from the bitshuffle package's")
                    p, back = self.decode(ours, pixels.dtype.itemsize)
                    self.assertEqual(back, pixels.tobytes())

    def test_reference_bytes_decode_to_the_same_pixels(self):
        rng = np.random.default_rng(7)
        for dtype in (np.uint8, np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8")):
            pixels = rng.poisson(20, size=12345).astype(dtype)
            with self.subTest(dtype=str(np.dtype(dtype))):
                p, back = self.decode(reference_encode(pixels), np.dtype(dtype).itemsize)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(back, pixels.tobytes())

    def test_real_eiger2_frames(self):
        folders = ["r500k_bm_bslz4_8bit", "r500k_bm_bslz4_16bit", "r500k_bm_bslz4_32bit"]
        if not all(os.path.isdir(os.path.join(REAL, f)) for f in folders):
            if REQUIRE_REAL:
                self.fail(f"NUMASTREAM_REQUIRE_REAL=1: the EIGER2 recordings are not in {REAL}")
            self.skipTest(f"the EIGER2 recordings are not in {REAL}")
        seen = 0
        for folder in folders:
            for name, algorithm, elem, dtype, data, shape in real_frames(folder):
                with self.subTest(folder=folder, frame=name):
                    self.assertEqual(algorithm, "bslz4")
                    self.assertEqual(elem, np.dtype(dtype).itemsize)
                    p, back = self.decode(data, elem)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    want = reference_decode(data, dtype)
                    self.assertEqual(want.size, shape[0] * shape[1])
                    self.assertEqual(back, want.tobytes(), "decoded pixels differ from the bitshuffle package's")
                    # Re-encoded by us: the detector's bytes exactly.
                    self.assertEqual(self.encode(want), data, "re-encoding a detector frame did not give its bytes")
                    seen += 1
        self.assertEqual(seen, 3 * 10 * 3, "10 images x 3 channels in each of the 3 bslz4 recordings")

    def test_damaged_frames_exit_3_naming_the_file(self):
        pixels = np.arange(5000, dtype="<u2")
        good = reference_encode(pixels)
        for what, bad in (("truncated", good[:-3]), ("wrong raw size", struct.pack(">Q", 4) + good[8:]),
                          ("block length past the end", good[:12] + b"\x7f\xff\xff\xff" + good[16:])):
            with self.subTest(what=what):
                p, _ = self.decode(bad, 2)
                self.assertEqual(p.returncode, 3, p.stderr)
                self.assertIn("is not valid bslz4 data", p.stderr)


if __name__ == "__main__":
    unittest.main()
