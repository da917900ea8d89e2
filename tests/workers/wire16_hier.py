"""Worker of tests/core/test_wire16_engine.py::test_wire16_hier: one
allreduce on the 16-bit wire and one without, under the hierarchical
algorithm (ranks spread over pretend hosts by TFRING_HOSTNAME)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))

import numpy as np  # noqa: E402

import wire16_ref as ref  # noqa: E402
from common import digest, report  # noqa: E402

import tfring.basics as basics  # noqa: E402
from tfring import _core  # noqa: E402

basics.init()
rank, n = basics.rank(), basics.size()
xs = np.random.default_rng(3).standard_normal((n, 50_001)).astype(np.float32)
exact = xs.astype(np.float64).sum(axis=0)
got = _core.allreduce(xs[rank], name="hier.wire", wire="float16")
wired = _core.last_collective_stats()
_core.allreduce(xs[rank], name="hier.plain")
plain = _core.last_collective_stats()
# Each host sums its ranks in float32 (one float32 rounding), the 2-host
# ring rounds one host's sum to 16 bits (either host's, by segment) and
# the result once more.
h = [np.abs(xs[2 * k].astype(np.float64) + xs[2 * k + 1]) for k in range(n // 2)]
bound = 1.01 * ((ref.U["float16"] + 2 * ref.U32) * sum(h)
                + (ref.U["float16"] + ref.U32) * np.abs(exact))
report({"digest": digest([got]), "wired": wired, "plain": plain,
        "error": ref.errors(got, exact, "float16"),
        "within": bool((np.abs(got - exact) <= bound).all())})
basics.shutdown()
