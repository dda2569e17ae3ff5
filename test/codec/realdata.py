"""What the codec tests share: the agent under test and where the real EIGER2 recordings are."""
import os

import numpy as np

AGENT = os.environ.get("NUMASTREAM_AGENT", "bin/numastream-agent")
# Next to the repository (../shared/data/dectris-stream-v2), or where NUMASTREAM_DECTRIS_DATA says.
REAL = os.environ.get(
    "NUMASTREAM_DECTRIS_DATA",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "dectris-stream-v2")))
REQUIRE_REAL = os.environ.get("NUMASTREAM_REQUIRE_REAL") == "1"
# RFC 8746 typed array tags in the recordings.
TYPED_ARRAY = {64: np.dtype("u1"), 69: np.dtype("<u2"), 70: np.dtype("<u4")}
