"""Stream V2 as DECTRIS's own client reads it: a ZeroMQ PULL socket, cbor2 with the tags the
Stream V2 specification defines (RFC 8746 multi-dimensional and typed arrays, DECTRIS's
compression tag 56500 decoded by DECTRIS's `dectris-compression` package), on every message
detector-sim emits and the gateway re-emits (`--sink stream2`), for every pixel type,
compression and channel set; and the start message's fields against the specification's list.

Run: NUMASTREAM_AGENT=bin/numastream-agent $(hack/pyenv.sh) test/codec/dectris_decoder_test.py
"""
import os
import subprocess
import tempfile
import unittest

import cbor2
import numpy as np
import zmq
from dectris.compression import decompress

from realdata import AGENT, free_port, recording
from stream2_hdf5_test import channels_of, load_cbor

# RFC 8746 typed arrays (the little-endian unsigned ones Stream V2 images use) and DECTRIS's tags.
TYPED = {64: "u1", 69: "<u2", 70: "<u4"}
MULTI_DIM, COMPRESSED = 40, 56500

# The start message's fields as DECTRIS's Stream V2 specification lists them (stream_v2/README.md),
# and those a detector sends only with the feature on (detector-sim enables neither).
SPEC_START = {"type", "arm_date", "beam_center_x", "beam_center_y", "channels", "count_time",
              "countrate_correction_enabled", "countrate_correction_lookup_table", "detector_description",
              "detector_serial_number", "detector_translation", "flatfield", "flatfield_enabled", "frame_time",
              "goniometer", "image_dtype", "image_size_x", "image_size_y", "incident_energy", "incident_wavelength",
              "number_of_images", "pixel_mask", "pixel_mask_enabled", "pixel_size_x", "pixel_size_y",
              "saturation_value", "sensor_material", "sensor_thickness", "series_id", "series_unique_id",
              "threshold_energy", "user_data", "virtual_pixel_interpolation_enabled"}
ONLY_WHEN_ENABLED = {"countrate_correction_lookup_table", "flatfield"}


def tag_hook(*args):
    """The tags a Stream V2 client decodes, written from the specification. (cbor2 passes the tag
    and whether the result must be immutable; its documentation says the decoder and the tag.)"""
    tag = next(a for a in args if isinstance(a, cbor2.CBORTag))
    if tag.tag == COMPRESSED:
        algorithm, elem_size, encoded = tag.value
        return decompress(encoded, algorithm, elem_size=elem_size)
    if tag.tag in TYPED:
        return np.frombuffer(tag.value, dtype=TYPED[tag.tag])
    if tag.tag == MULTI_DIM:
        dims, contents = tag.value
        return np.asarray(contents).reshape(dims)
    return tag


def pull(endpoint, count, bind=False, timeout_ms=60000):
    """`count` messages from a PULL socket, as DECTRIS's client takes them."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.setsockopt(zmq.LINGER, 0)
    (sock.bind if bind else sock.connect)(endpoint)
    try:
        return [sock.recv() for _ in range(count)]
    finally:
        sock.close()
        ctx.term()


class StreamV2ReadByDectrisDecoder(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.tmp])

    def projections(self, images, channels, shape, dtype):
        """The simulator's synthetic pixels: image i of channel c is projection i + 5c of
        `numastream-agent synth`, its 16-bit counts as the series' pixel type (capped at 255)."""
        frames = images + 5 * (channels - 1)
        src = os.path.join(self.tmp, "src.raw")
        subprocess.run([AGENT, "synth", "--out", src, "--chunk-bytes", str(shape[0] * shape[1] * 2), "--width",
                        str(shape[1]), "--frames", str(frames), "--seed", "7"], check=True, capture_output=True)
        counts = np.fromfile(src, dtype="<u2").reshape(frames, *shape)
        return np.minimum(counts, 255).astype("u1") if dtype == "uint8" else counts.astype(dtype)

    def assertSeriesDecodes(self, raw, images, channels, shape, dtype, compression, where):
        messages = [cbor2.loads(m, tag_hook=tag_hook) for m in raw]
        self.assertEqual([m["type"] for m in messages], ["start"] + ["image"] * images + ["end"], where)
        start = messages[0]
        self.assertEqual(set(start) | ONLY_WHEN_ENABLED, SPEC_START,
                         f"{where}: the start message's fields are the specification's")
        self.assertEqual((start["image_dtype"], start["image_size_y"], start["image_size_x"], list(start["channels"])),
                         (dtype, shape[0], shape[1], channels))
        self.assertEqual(start["goniometer"], {"omega": {"start": 0.0, "increment": 0.25}})
        for c in channels:
            self.assertEqual(start["pixel_mask"][c].shape, shape)
        pixels = self.projections(images, len(channels), shape, dtype)
        for m in messages[1:-1]:
            for k, c in enumerate(channels):
                got = m["data"][c]
                self.assertEqual((got.dtype, got.shape), (np.dtype(dtype), shape), f"{where} {c}")
                np.testing.assert_array_equal(got, pixels[m["image_id"] + 5 * k],
                                              err_msg=f"{where}: image {m['image_id']} {c} ({compression})")

    def through_a_gateway(self, sim, count):
        """The messages of detector-sim `sim`, read directly and through a sender and a gateway
        that re-emits them (`--sink stream2`): (direct, re-emitted)."""
        det, data, out = (f"tcp://127.0.0.1:{free_port()}" for _ in range(3))
        p = subprocess.Popen([AGENT, "detector-sim", "--endpoint", det, "--linger-s", "30", *sim],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            raw = pull(det, count)
        finally:
            p.kill()
            p.communicate()
        rx = subprocess.Popen([AGENT, "receive", "--endpoint", data, "--chunk-bytes", str(4 << 20), "--sink", "stream2",
                               "--sink-endpoint", out, "--idle-timeout", "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sim_p = subprocess.Popen([AGENT, "detector-sim", "--endpoint", det, "--linger-s", "30", *sim],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        tx = subprocess.Popen([AGENT, "send", "--endpoint", data, "--chunk-bytes", str(4 << 20), "--source", "stream2",
                               "--source-endpoint", det], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            again = pull(out, count)
        finally:
            for q in (tx, sim_p, rx):
                q.kill()
                q.communicate()
        return raw, again

    def test_the_real_eiger2_recordings_decode_directly_and_re_emitted(self):
        for name in ("r500k_bm_bslz4_16bit", "r500k_bm_bslz4_32bit", "r500k_bm_bslz4_8bit", "r500k_bm_lz4_16bit"):
            with self.subTest(recording=name):
                folder = recording(self, name)
                files = sorted(os.listdir(folder))
                want = {}
                for f in files:
                    m = load_cbor(os.path.join(folder, f))
                    if m["type"] == "image":  # decoded by the reference libraries (bitshuffle, lz4)
                        want[m["image_id"]] = {c: pixels for c, (pixels, _, _) in channels_of(m).items()}
                raw, again = self.through_a_gateway(["--replay", folder, "--start"], len(files) + 1)
                for where, messages in (("detector-sim", raw), ("the gateway's re-emit", again)):
                    decoded = [cbor2.loads(m, tag_hook=tag_hook) for m in messages]
                    self.assertEqual([m["type"] for m in decoded], ["start"] + ["image"] * len(want) + ["end"], where)
                    for m in decoded[1:-1]:
                        for c, pixels in want[m["image_id"]].items():
                            np.testing.assert_array_equal(m["data"][c], pixels,
                                                          err_msg=f"{name} {where}: image {m['image_id']} {c}")
                print(f"[dectris] {name}: {len(files) + 1} messages, directly and re-emitted, decoded by cbor2 + "
                      f"dectris-compression: {len(want)} images x {len(want[0])} channels equal to the reference "
                      "libraries' decoding")

    def test_every_message_detector_sim_emits_and_the_gateway_re_emits_decodes(self):
        shape, images = (48, 80), 6
        cases = [(dtype, compression, channels) for dtype in ("uint8", "uint16", "uint32")
                 for compression in ("bslz4", "lz4") for channels in (["threshold_1"], ["threshold_1", "threshold_2"])]
        for dtype, compression, channels in cases:
            with self.subTest(dtype=dtype, compression=compression, channels=len(channels)):
                sim = ["--synthetic", "--images", str(images), "--shape", f"{shape[0]}x{shape[1]}", "--dtype", dtype,
                       "--compression", compression, "--channels", ",".join(channels), "--goniometer",
                       "omega=0,0.25"]
                raw, again = self.through_a_gateway(sim, images + 2)
                self.assertSeriesDecodes(raw, images, channels, shape, dtype, compression, "detector-sim")
                self.assertEqual([cbor2.loads(m)["type"] for m in again], [cbor2.loads(m)["type"] for m in raw])
                self.assertSeriesDecodes(again, images, channels, shape, dtype, compression, "the gateway's re-emit")
        print(f"[dectris] {len(cases)} series (uint8/16/32 x bslz4/lz4 x 1-2 channels): every message detector-sim "
              "emits and the gateway re-emits decoded by cbor2 + dectris-compression, pixels the simulator's; "
              "the start message has the specification's fields")


if __name__ == "__main__":
    unittest.main(verbosity=2)
