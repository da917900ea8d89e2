"""Rank worker for tests/core/test_api_fuzz.py: random calls of the public API.

Every rank draws the same plan from one seed (TFRING_FUZZ_SEED): the
operation, the API (the TF ops or the numpy `_core`), dtype, shape, root,
splits, name (fresh, reused from a small pool, or none) and process set,
and, for some calls, one rank (or every rank) that gets a wrong argument or
a tensor that disagrees with the others'. Each rank's input is drawn from
(seed, call, rank), so every rank can compute every call's numpy
reference. A call without a planted fault must return the reference on
every rank; a call with one must raise on every rank, naming the tensor.
The ranks stop together once TFRING_FUZZ_SECONDS have passed on the
slowest. Reports {"calls", "faults", "failures"}."""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from common import report

import tfring
from tfring import _core

tf.config.threading.set_intra_op_parallelism_threads(1)

SEED = int(os.environ.get("TFRING_FUZZ_SEED", "1"))
SECONDS = float(os.environ.get("TFRING_FUZZ_SECONDS", "20"))
SLOW = 10.0  # a call taking longer waited for something: reported

tfring.init()
rank, size = tfring.rank(), tfring.size()
PSET = tfring.add_process_set([0, size - 1] if size > 2 else [0])

OPS = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall",
       "grouped_allreduce"]
NUMERIC = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32",
           "float64"]
FAULTS = {  # op -> faults that apply
    "allreduce": ["shape", "dtype", "bool"],
    "allgather": ["scalar", "dtype", "trailing"],
    "broadcast": ["root_high", "root_neg", "shape", "dtype"],
    "reducescatter": ["scalar", "shape", "dtype"],
    "alltoall": ["splits_sum", "splits_neg", "splits_len", "indivisible", "dtype"],
    "grouped_allreduce": ["shape", "count"],
}


def data(rng, dt, shape):
    lo = 0 if dt.startswith("uint") or dt == "bool" else -3
    v = rng.integers(lo, 4, size=shape)
    return (v % 2 == 0) if dt == "bool" else v.astype(dt)


def plan(rng, it):
    """One call, the same on every rank."""
    p = {"it": it, "op": str(rng.choice(OPS))}
    p["api"] = "tf" if p["op"] == "grouped_allreduce" else str(rng.choice(["tf", "core"]))
    p["pset"] = bool(rng.random() < 0.2)
    p["members"] = list(PSET.ranks) if p["pset"] else list(range(size))
    mode = rng.choice(["fresh", "pool", "none"], p=[0.4, 0.4, 0.2])
    if p["pset"] and mode == "none":
        mode = "fresh"  # unnamed calls match by order: every rank must make them
    p["name"] = {"fresh": f"fz.{it}", "pool": f"fz.pool.{p['op']}.{rng.integers(3)}",
                 "none": None}[mode]
    dtypes = NUMERIC + (["bool"] if p["op"] in ("allgather", "broadcast", "alltoall") else [])
    p["dtype"] = str(rng.choice(dtypes))
    n = len(p["members"])
    p["shape"] = [int(d) for d in rng.integers(0, 4, size=rng.integers(1, 4))]
    if p["op"] in ("allreduce", "broadcast", "grouped_allreduce") and rng.random() < 0.2:
        p["shape"] = []
    p["rows"] = [int(r) for r in rng.integers(0, 4, size=n)]  # allgather
    p["root"] = int(rng.integers(n))
    p["reduce"] = str(rng.choice(["sum", "min", "max"] +
                                 (["average"] if p["dtype"].startswith("float") else [])))
    p["splits"] = [[int(s) for s in rng.integers(0, 3, size=n)] for _ in range(n)]
    p["even"] = bool(rng.random() < 0.3)
    p["parts"] = int(rng.integers(1, 4))
    p["fault"] = None
    if rng.random() < 0.3:
        p["fault"] = str(rng.choice(FAULTS[p["op"]]))
        if p["fault"] == "indivisible" and n == 1:
            p["fault"] = "splits_sum"  # every first dimension divides by 1
        if p["fault"] == "bool" and p["api"] == "tf":
            p["fault"] = "shape"  # TF refuses bool when it builds the op, on that rank only
        p["bad"] = p["members"] if rng.random() < 0.3 else [p["members"][int(rng.integers(n))]]
        if p["fault"] in ("shape", "dtype", "trailing", "count") and len(p["bad"]) == n:
            p["bad"] = [p["members"][-1]]  # a disagreement needs someone to disagree with
            if n == 1:
                p["fault"] = None
    return p


def inputs(p, r):
    """Rank r's input for call p (and its splits for alltoall)."""
    rng = np.random.default_rng([SEED, p["it"], r])
    bad = p["fault"] is not None and r in p["bad"]
    dt, shape, f = p["dtype"], list(p["shape"]), p["fault"] if bad else None
    n, i = len(p["members"]), p["members"].index(r)
    if f == "dtype":
        dt = "float32" if dt != "float32" else "int32"
    if f == "bool":
        dt = "bool"
    op = p["op"]
    if op == "allgather":
        shape = [p["rows"][i]] + shape[1:]
        if f == "trailing":
            shape = shape + [2]
    if op == "reducescatter" and not shape:
        shape = [2]
    if op == "alltoall":
        if p["even"]:
            shape = [n * (shape[0] if shape else 1)] + shape[1:]
        else:
            shape = [sum(p["splits"][i])] + shape[1:]
    if f == "scalar":
        shape = []
    if f == "shape":
        shape = (shape or [1])[:-1] + [(shape or [1])[-1] + 1]
    splits = None if p["even"] else list(p["splits"][i])
    if f in ("splits_sum", "splits_neg", "splits_len"):
        # From the splits this rank would give (an even split's, spelled
        # out), made wrong.
        splits = splits or [shape[0] // n] * n
        if f == "splits_sum":
            splits[-1] += 1
        elif f == "splits_neg":
            splits[0] = -1
        else:
            splits = splits + [0]
    elif f == "indivisible":
        splits = None
        shape = [n * (shape[0] if shape else 1) + 1] + shape[1:]
    if op == "grouped_allreduce":
        k = p["parts"] + (1 if f == "count" else 0)
        return [data(rng, dt, shape) for _ in range(k)], None
    return data(rng, dt, shape), splits


def reference(p):
    """This rank's expected output of a call without faults."""
    mem = p["members"]
    xs = {r: inputs(p, r)[0] for r in mem}
    me = mem.index(rank)
    op = p["op"]
    if op == "allgather":
        return np.concatenate([xs[r] for r in mem])
    if op == "broadcast":
        return xs[mem[p["root"]]]
    if op == "alltoall":
        outs = []
        for r in mem:
            i = mem.index(r)
            x, sp = xs[r], inputs(p, r)[1]
            rows = [x.shape[0] // len(mem)] * len(mem) if sp is None else sp
            start = sum(rows[:me])
            outs.append(x[start:start + rows[me]])
        return np.concatenate(outs)

    def reduce(arrs):
        a = np.stack([x.astype(np.float64) for x in arrs])
        red = {"sum": a.sum(0), "average": a.mean(0), "min": a.min(0), "max": a.max(0)}
        return red[p["reduce"]].astype(arrs[0].dtype) if p["reduce"] != "average" else \
            red["average"]
    if op == "grouped_allreduce":
        return [reduce([xs[r][k] for r in mem]) for k in range(p["parts"])]
    full = reduce([xs[r] for r in mem])
    if op == "allreduce":
        return full
    d0, n = full.shape[0], len(mem)
    counts = [d0 // n + (1 if i < d0 % n else 0) for i in range(n)]
    start = sum(counts[:me])
    return full[start:start + counts[me]]


REDUCE = {"sum": tfring.Sum, "average": tfring.Average, "min": tfring.Min, "max": tfring.Max}


def call(p):
    x, splits = inputs(p, rank)
    name, op = p["name"], p["op"]
    mem = p["members"]
    root = mem[p["root"]]
    if p["fault"] in ("root_high", "root_neg") and rank in p["bad"]:
        root = size if p["fault"] == "root_high" else -1
    if p["api"] == "core":
        ps = PSET.process_set_id if p["pset"] else 0
        if op == "alltoall":
            return _core.alltoall(x, splits, name=name, process_set=ps)[0]
        return getattr(_core, op)(x, p["reduce"], name, root, process_set=ps)
    kw = {"name": name}
    if p["pset"]:
        kw["process_set"] = PSET
    if op == "grouped_allreduce":
        return [t.numpy() for t in tfring.grouped_allreduce(
            [tf.constant(a) for a in x], op=REDUCE[p["reduce"]], **kw)]
    t = tf.constant(x)
    if op == "allreduce":
        out = tfring.allreduce(t, op=REDUCE[p["reduce"]], **kw)
    elif op == "allgather":
        out = tfring.allgather(t, **kw)
    elif op == "broadcast":
        out = tfring.broadcast(t, root_rank=root, **kw)
    elif op == "reducescatter":
        out = tfring.reducescatter(t, op=REDUCE[p["reduce"]], **kw)
    else:
        out = tfring.alltoall(t, splits=splits, **kw)
        out = out[0] if splits is not None else out
    return out.numpy()


def same(got, want, dt):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype.kind == "f" or got.dtype.kind == "f":
        tol = 1e-2 if "16" in str(got.dtype) else 1e-6
        return bool(np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                atol=tol))
    return bool(np.array_equal(got, want))


failures = []
calls = faults = 0
rng = np.random.default_rng(SEED)
start = time.monotonic()
it = 0
while True:
    if it % 10 == 0:
        # Stop together: once the slowest rank is past its time.
        late = _core.allreduce(np.array([time.monotonic() - start > SECONDS], np.int32), "max",
                               f"fz.stop.{it}")
        if late[0]:
            break
    p = plan(rng, it)
    it += 1
    if rank not in p["members"]:
        continue
    calls += 1
    faults += p["fault"] is not None
    t0 = time.monotonic()
    try:
        got = call(p)
        err = None
    except Exception as e:  # noqa: BLE001 - judged below
        got, err = None, e
    took = time.monotonic() - t0
    what = {k: p[k] for k in ("it", "op", "api", "dtype", "shape", "name", "pset", "fault")}
    if took > SLOW:
        failures.append(f"{what}: took {took:.1f} s")
    if p["fault"] is not None:
        if err is None:
            failures.append(f"{what}: no error on rank {rank} (bad ranks {p['bad']})")
        elif p["name"] is not None and f"'{p['name']}" not in str(err):
            failures.append(f"{what}: error does not name the tensor: {str(err)[:300]}")
        continue
    if err is not None:
        failures.append(f"{what}: raised {type(err).__name__}: {str(err)[:300]}")
        continue
    want = reference(p)
    ok = (all(same(g, w, p["dtype"]) for g, w in zip(got, want)) and len(got) == len(want)
          if p["op"] == "grouped_allreduce" else same(got, want, p["dtype"]))
    if not ok:
        failures.append(f"{what}: wrong result on rank {rank}: {np.asarray(got).ravel()[:8]} "
                        f"!= {np.asarray(want).ravel()[:8]}")

report({"calls": calls, "faults": faults, "iterations": it, "failures": failures[:50]})
tfring.shutdown()
sys.exit(0)
