"""The 16-bit wire through the engine (tfring._core.allreduce(wire=...)):
run by tests/core/test_wire16_engine.py on 2 ranks, once per pass of
TEST_PASSES. Reports, per check, what the test asserts on."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))

import wire16_ref as ref  # noqa: E402
from common import digest, run_passes  # noqa: E402

import tfring.basics as basics  # noqa: E402
from tfring import _core  # noqa: E402

COUNT = 100_003


def data(n, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((n, COUNT)) * scale).astype(np.float32)


def one_host_auto():
    """Under auto on one host's shared memory, a wire request is served at
    float32: the same bits as the plain sum, no wire in the stats."""
    rank, n = basics.rank(), basics.size()
    xs = data(n, 13)
    plain = _core.allreduce(xs[rank], op="sum", name="auto.plain")
    got = _core.allreduce(xs[rank], op="sum", name="auto.wire", wire="float16")
    st = _core.last_collective_stats()
    return {"auto": {"same_as_plain": bool(np.array_equal(got, plain)), "wire": st["wire"],
                     "algo": st["algo"], "digest": digest([got])}}


def body():
    if os.environ.get("TFRING_ALLREDUCE_ALGO", "auto") == "auto":
        return one_host_auto()
    rank, n = basics.rank(), basics.size()
    out = {}
    # In-ring sums against the cast-then-sum path (float16 tensors summed by
    # the core's float16 ring), both measured on the product's path.
    for wire, dt in (("float16", np.float16), ("bfloat16", None)):
        xs = data(n, 11)
        exact = xs.astype(np.float64).sum(axis=0)
        got = _core.allreduce(xs[rank], op="sum", name=f"sum.{wire}", wire=wire)
        entry = {"digest": digest([got]), "in_ring": ref.errors(got, exact, wire),
                 "emulated": bool(np.array_equal(got, ref.ring_wire_sum(xs, wire))),
                 "stats": _core.last_collective_stats()}
        if dt is not None:
            cast = _core.allreduce(xs[rank].astype(dt), op="sum", name=f"cast.{wire}")
            entry["cast_then_sum"] = ref.errors(cast.astype(np.float32), exact, wire)
        out[wire] = entry
    # Average near float16's limit (inputs up to 60000, sums past 65504):
    # prescaled by 1/N before narrowing.
    xs = np.random.default_rng(12).uniform(20000, 60000, (n, COUNT)).astype(np.float32)
    got = _core.allreduce(xs[rank], op="average", name="avg.big", wire="float16")
    cast = _core.allreduce(xs[rank].astype(np.float16), op="average", name="avg.cast")
    exact = xs.astype(np.float64).mean(axis=0)
    out["average"] = {"digest": digest([got]), "finite": bool(np.isfinite(got).all()),
                      "cast_finite": bool(np.isfinite(cast).all()),
                      "within": bool((np.abs(got - exact)
                                      <= ref.ring_bound(xs, "float16", 1.0 / n)).all())}
    # Integers ignore the wire; a float64 tensor too (the TF layer casts it).
    ints = np.arange(10, dtype=np.int32) + rank
    got = _core.allreduce(ints, op="sum", name="ints", wire="bfloat16")
    out["ints"] = bool(np.array_equal(got, np.arange(10) * n + n * (n - 1) // 2))
    # Tensors on different wires submitted together: never one buffer.
    xs = data(n, 13)
    hs = [_core.allreduce_async(xs[rank][:1000], name="fuse.a", wire="float16"),
          _core.allreduce_async(xs[rank][1000:2000], name="fuse.b", wire="bfloat16"),
          _core.allreduce_async(xs[rank][2000:3000], name="fuse.c")]
    a, b, c = (h.wait() for h in hs)
    out["fused"] = {
        "a": bool(np.array_equal(a, ref.ring_wire_sum(xs[:, :1000], "float16"))),
        "b": bool(np.array_equal(b, ref.ring_wire_sum(xs[:, 1000:2000], "bfloat16"))),
        "c": bool(np.array_equal(c, xs[:, 2000:3000].sum(axis=0, dtype=np.float32)))}
    # Ranks that disagree on the wire: an error naming the tensor and ranks.
    wires = ["float16", "bfloat16", None, "float16"]
    try:
        _core.allreduce(np.ones(8, np.float32), name="mismatch", wire=wires[rank % 4])
        out["mismatch"] = None
    except Exception as e:  # noqa: BLE001 - the test reads the message
        out["mismatch"] = f"{type(e).__name__}: {e}"
    try:
        _core.allgather(np.ones(4, np.float32), name="ag", wire="float16")
        out["allgather"] = None
    except ValueError as e:
        out["allgather"] = str(e)
    return out


run_passes(body)
