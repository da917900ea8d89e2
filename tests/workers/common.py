"""Helpers shared by worker scripts (run inside each rank)."""

import hashlib
import json
import os
import sys
import traceback

import numpy as np


def report(obj):
    path = os.environ.get("TFRING_RESULT")
    if not path:  # under mpirun: one file per MPI rank in a directory
        rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK")
        path = os.path.join(os.environ["TFRING_RESULT_DIR"], f"{rank}.json")
    with open(path, "w") as f:
        json.dump(obj, f)


def run_checks(checks):
    """Runs named checks ({name: callable}); each result is {"error", "value"},
    a failure recorded with its traceback instead of stopping the rest."""
    results = {}
    for name, fn in checks.items():
        try:
            results[name] = {"error": None, "value": fn()}
        except Exception:  # noqa: BLE001 - reported per check
            results[name] = {"error": traceback.format_exc(), "value": None}
    return results


def checker(results, announce=False):
    """`@check(name)` runs the decorated function at once and stores its dict
    (with "ok") in results[name]; a failure stores "ok": False and the
    traceback, and prints it, instead of stopping the worker."""
    def check(name):
        def deco(fn):
            if announce:
                print(f"=== {name}", flush=True)
            try:
                out = fn() or {}
                out.setdefault("ok", True)
            except Exception:  # noqa: BLE001 - reported to the test
                out = {"ok": False, "error": traceback.format_exc()}
                print(f"check {name} failed:\n{out['error']}", file=sys.stderr)
            results[name] = out
            return fn
        return deco
    return check


def compare(failures, what, got, want, tol):
    """Appends to `failures` how `got` differs from `want` (exactly when tol
    is 0, else within rtol = atol = tol): the shape, or the first few
    mismatching elements."""
    got = np.asarray(got)
    if got.shape != want.shape:
        failures.append(f"{what}: shape {got.shape} != {want.shape}")
        return
    ok = np.array_equal(got, want) if tol == 0 else np.allclose(got, want, rtol=tol, atol=tol)
    if not ok:
        bad = np.argwhere(~np.isclose(got, want, rtol=tol, atol=tol)).ravel()[:5]
        failures.append(f"{what}: mismatch at {bad.tolist()}: got {got[bad]} want {want[bad]}")


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# bfloat16 travels as uint16 bit patterns; numpy has no native type.
def f32_to_bf16_bits(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_bits_to_f64(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8"]
OPS = ["sum", "average", "min", "max", "product"]


def make_input(dtype, count, rank, salt, op):
    """Deterministic per-rank data small enough that no op overflows."""
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        if op == "product":
            vals = rng.uniform(0.5, 1.5, count)
        else:
            vals = rng.uniform(-4, 4, count)
        if dtype == "bfloat16":
            return f32_to_bf16_bits(vals), "bfloat16"
        return vals.astype(dtype), None
    if op == "product":
        vals = rng.integers(1, 3, count)
    elif dtype == "uint8":
        vals = rng.integers(0, 30, count)
    else:
        vals = rng.integers(-15, 16, count)
    return vals.astype(dtype), None


def to_f64(arr, dtype):
    if dtype == "bfloat16":
        return bf16_bits_to_f64(arr)
    return np.asarray(arr).astype(np.float64)


def reference(inputs, dtype, op, n):
    xs = [to_f64(a, dtype) for a in inputs]
    if op in ("sum", "average"):
        r = np.sum(xs, axis=0)
        if op == "average":
            r = r / n
            if not dtype.startswith(("float", "bfloat")):
                r = np.trunc(r)
    elif op == "min":
        r = np.min(xs, axis=0)
    elif op == "max":
        r = np.max(xs, axis=0)
    else:
        r = np.prod(xs, axis=0)
    if not dtype.startswith(("float", "bfloat")):
        # Integer arithmetic wraps around like numpy's (two's complement).
        r = r.astype(np.int64).astype(dtype).astype(np.float64)
    return r


def averaged_batch(core, counts, rank, n, salt, name, timeout):
    """Submits one float32 tensor per count with allreduce_async (average)
    so the engine may fuse them, waits for each; yields (index, result,
    float64 reference). Salts follow `salt` + 1, + 2, ..."""
    hs, wants = [], []
    for i, count in enumerate(counts):
        x, _ = make_input("float32", count, rank, salt + i + 1, "sum")
        hs.append(core.allreduce_async(x, op="average", name=f"{name}.{i}"))
        wants.append(reference([make_input("float32", count, r, salt + i + 1, "sum")[0]
                                for r in range(n)], "float32", "average", n))
    for i, (h, want) in enumerate(zip(hs, wants)):
        yield i, h.wait(timeout), want


def tolerance(dtype, n):
    return {"float16": 2e-3 * n, "bfloat16": 1e-2 * n, "float32": 1e-6 * n,
            "float64": 1e-12 * n}.get(dtype, 0)


def adasum_ref(vectors):
    """Horovod's recursive pairwise Adasum in numpy float64."""
    tiny = np.sqrt(np.finfo(np.float64).tiny)
    level = [np.asarray(v, np.float64) for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            dot, an, bn = np.sum(a * b), np.sum(a * a), np.sum(b * b)
            ac = 1.0 - dot / an * 0.5 if an >= tiny else 1.0
            bc = 1.0 - dot / bn * 0.5 if bn >= tiny else 1.0
            nxt.append(ac * a + bc * b)
        level = nxt
    return level[0]


def run_passes(body):
    """Runs body() once per pass of TEST_PASSES and reports the list of its
    results; without TEST_PASSES, once, reporting its result. TEST_PASSES is
    a JSON list of environments ({var: value, or [value of rank 0, of rank
    1, ...]}): each pass sets its variables, joins the job (tfring.init,
    which reads the configuration), runs body and leaves (shutdown), so a
    test checks several configurations on the ranks of one launch."""
    import tfring.basics as basics

    spec = os.environ.get("TEST_PASSES")
    if not spec:
        basics.init()
        out = body()
        basics.shutdown()
        report(out)
        return
    rank = int(os.environ.get("TFRING_RANK", "0"))
    results, set_before = [], set()
    for env in json.loads(spec):
        for k in set_before - set(env):
            os.environ.pop(k, None)
        for k, v in env.items():
            os.environ[k] = str(v[rank] if isinstance(v, list) else v)
        set_before = set(env)
        basics.init()
        results.append(body())
        basics.shutdown()
    report(results)


def delta(after, before):
    """after - before for nested dicts of counters (process-wide totals, so
    one pass's own calls)."""
    if isinstance(after, dict):
        return {k: delta(v, before.get(k, 0) if isinstance(before, dict) else 0)
                for k, v in after.items()}
    return after - before
