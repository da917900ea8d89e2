"""Worker of tests/core/test_wire16_engine.py::test_wire16_hosts*: the
16-bit wire between pretend hosts (one rank each, TFRING_HOSTNAME), once
per pass of the test's (TFRING_ALLREDUCE_ALGO rabenseifner, ring, auto).
Each result is compared with the emulation of the algorithm that ran.
Reports what the test asserts on."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))

import numpy as np  # noqa: E402

import wire16_ref as ref  # noqa: E402
from common import digest, run_passes  # noqa: E402

import tfring.basics as basics  # noqa: E402
from tfring import _core  # noqa: E402

COUNT = 60_001
SIZES = (30_000, 50_001, 20_000)  # submitted together: fused, or not


def fused(xs, emulate, groups):
    """The tensors' results when consecutive runs of `groups` tensors are
    reduced as one buffer each."""
    out, at = [], 0
    for g in groups:
        sizes = SIZES[at:at + g]
        lo = sum(SIZES[:at])
        whole = emulate(xs[:, lo:lo + sum(sizes)], "float16")
        out += np.split(whole, np.cumsum(sizes)[:-1])
        at += g
    return out


def body():
    rank, n = basics.rank(), basics.size()
    out = {}
    emulate = None
    for wire, seed in (("float16", 31), ("bfloat16", 32)):
        xs = np.random.default_rng(seed).standard_normal((n, COUNT)).astype(np.float32)
        exact = xs.astype(np.float64).sum(axis=0)
        got = _core.allreduce(xs[rank], op="sum", name=f"hosts.{wire}", wire=wire)
        st = _core.last_collective_stats()
        emulate = ref.ring_wire_sum if st["algo"] == "ring" else ref.tree_wire_sum
        out[wire] = {"digest": digest([got]), "stats": st,
                     "emulated": bool(np.array_equal(got, emulate(xs, wire))),
                     "error": ref.errors(got, exact, wire),
                     "bytes": ref.tree_bytes_sent(n, COUNT, rank)}
    # Several tensors on one wire at once: the engine may fuse them into
    # one buffer (allreduceSpans), whose blocks then span the tensors.
    xs = np.random.default_rng(33).standard_normal((n, sum(SIZES))).astype(np.float32)
    cuts = np.cumsum(SIZES)[:-1]
    hs = [_core.allreduce_async(part, op="sum", name=f"hosts.group.{i}", wire="float16")
          for i, part in enumerate(np.split(xs[rank], cuts))]
    got = [h.wait() for h in hs]
    out["group"] = {"digest": digest(got), "algo": _core.last_collective_stats()["algo"],
                    "emulated": any(all(map(np.array_equal, got, fused(xs, emulate, groups)))
                                    for groups in ((3,), (1, 2), (2, 1), (1, 1, 1)))}
    return out


run_passes(body)
