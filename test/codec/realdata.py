"""What the codec tests share: the agent under test, where the real EIGER2 recordings are, a free
port."""
import os
import sys

import numpy as np

AGENT = os.environ.get("NUMASTREAM_AGENT", "bin/numastream-agent")
# Next to the repository (../shared/data/dectris-stream-v2), or where NUMASTREAM_DECTRIS_DATA says.
REAL = os.environ.get(
    "NUMASTREAM_DECTRIS_DATA",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "dectris-stream-v2")))
REQUIRE_REAL = os.environ.get("NUMASTREAM_REQUIRE_REAL") == "1"
# RFC 8746 typed array tags in the recordings.
TYPED_ARRAY = {64: np.dtype("u1"), 69: np.dtype("<u2"), 70: np.dtype("<u4")}


def recording(test, name):
    """The folder of one real EIGER2 recording for `test` (a unittest.TestCase): it fails under
    NUMASTREAM_REQUIRE_REAL=1, else skips, when the recordings are absent."""
    folder = os.path.join(REAL, name)
    if not os.path.isdir(folder):
        if REQUIRE_REAL:
            test.fail(f"NUMASTREAM_REQUIRE_REAL=1: the EIGER2 recordings are not in {REAL}")
        test.skipTest(f"the EIGER2 recordings are not in {REAL}")
    return folder


# A free loopback port below the ephemeral range: the benchmarks' helper (hack/benchlib.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hack"))
from benchlib import free_port  # noqa: E402,F401
