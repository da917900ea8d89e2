"""Rank worker for tests/core/test_validation.py: every argument check a rank can
make alone, on every path a call can take, given wrong on one rank (the
last) or on every rank.

Each cell calls one collective with one bad argument, records what each
rank raised, then runs a correct allreduce to show the job still works.
The results go back as {"cells": [...]} in call order, identical in order
on every rank (ranks outside the process set record "skipped")."""

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
tf.config.threading.set_inter_op_parallelism_threads(2)

tfring.init()
rank, size = tfring.rank(), tfring.size()
# On 3 ranks the first and the last (rank 1 is outside it, and set index 1
# is world rank 2); on 2 ranks, whose only other sets have one rank, rank
# 0 alone (a job of one inside the job: no coordinator at all).
PSET = tfring.add_process_set([0, size - 1] if size > 2 else [0])

ROOT = ("root_high", "root_neg")
SCALAR = ("scalar_allgather", "scalar_reducescatter")
SPLITS = ("a2a_negative", "a2a_too_many", "a2a_sum", "a2a_indivisible")
CHECKS = ROOT + SCALAR + ("bool_reduce",) + SPLITS
PATHS = ("fresh", "repeat", "unnamed", "grouped", "pset", "xla")


def applies(check, path, api):
    if api == "core":  # no grouped or XLA form in numpy
        return path not in ("grouped", "xla")
    if check == "bool_reduce":
        # TF's op registrations refuse bool for the reducing ops when the
        # op is built, before tfring sees the call.
        return False
    if path == "grouped":
        return check in SCALAR  # grouped_allgather / grouped_reducescatter
    if path == "xla":
        # Under XLA the shape is fixed at compile time (a scalar is refused
        # then) and there is no XLA alltoall: the root checks remain.
        return check in ROOT
    return True


def arguments(check, bad, n, members):
    """(kind, input as numpy, extra arguments) of one call on a group of n
    ranks whose world ranks are `members`."""
    x = np.arange(2 * n, dtype=np.float32) + 10 * rank
    if check in ROOT:
        root = members[0]
        if bad:
            root = size if check == "root_high" else -1
        return "broadcast", x, {"root": root}
    if check == "scalar_allgather":
        return "allgather", (np.float32(3) if bad else x), {}
    if check == "scalar_reducescatter":
        return "reducescatter", (np.float32(3) if bad else x), {}
    if check == "bool_reduce":
        return "allreduce", (x > 3 if bad else x), {}
    rows = x.reshape(2 * n, 1)
    splits = [2] * n
    if bad:
        if check == "a2a_negative":
            splits = [-1, 3] + [2] * (n - 2)
        elif check == "a2a_too_many":
            splits = splits + [0]
        elif check == "a2a_sum":
            splits = [2] * (n - 1) + [3]
        else:  # a2a_indivisible: an even split of 2n + 1 rows
            return "alltoall", np.zeros((2 * n + 1, 1), np.float32), {"splits": None}
    return "alltoall", rows, {"splits": splits if check != "a2a_indivisible" else None}


def tf_call(kind, x, extra, name, ps, path):
    kw = {"name": name}
    if ps is not None:
        kw["process_set"] = ps
    t = tf.constant(x)

    def run(t):
        if kind == "broadcast":
            return tfring.broadcast(t, root_rank=extra["root"], **kw)
        if kind == "allgather":
            if path == "grouped":
                return tfring.grouped_allgather([tf.ones([2]), t], **kw)
            return tfring.allgather(t, **kw)
        if kind == "reducescatter":
            if path == "grouped":
                return tfring.grouped_reducescatter([tf.ones([2 * size]), t], op=tfring.Sum,
                                                    **kw)
            return tfring.reducescatter(t, op=tfring.Sum, **kw)
        return tfring.alltoall(t, splits=extra["splits"], **kw)

    if path == "xla":
        return tf.function(run, jit_compile=True)(t)
    return run(t)


def core_call(kind, x, extra, name, ps_id):
    if kind == "alltoall":
        return _core.alltoall(x, extra["splits"], name=name, process_set=ps_id)
    fn = getattr(_core, kind)
    return fn(x, "sum", name, extra.get("root", 0), process_set=ps_id)


def one_cell(check, path, api, who, index):
    members = list(PSET.ranks) if path == "pset" else list(range(size))
    if rank not in members:
        return {"skipped": True}
    n = len(members)
    if check == "a2a_indivisible" and n == 1:
        return {"skipped": True}  # every first dimension divides by 1
    bad = who == "all" or rank == members[-1]
    name = None if path == "unnamed" else f"v.{check}.{path}.{api}.{who}.{index}"
    ps = PSET if path == "pset" else None
    kind, x, extra = arguments(check, bad, n, members)

    def call(x, extra):
        if api == "core":
            return core_call(kind, x, extra, name, PSET.process_set_id if ps else 0)
        return tf_call(kind, x, extra, name, ps, path)

    if path == "repeat":  # the same name, valid first: its cached path
        for _ in range(2):
            call(*arguments(check, False, n, members)[1:])
    out = {"skipped": False, "name": name, "bad": bad, "bad_rank": members[-1],
           "members": n}
    t0 = time.monotonic()
    try:
        call(x, extra)
        out.update(error=None, message="")
    except Exception as e:  # noqa: BLE001 - recorded for the test
        out.update(error=type(e).__name__, message=str(e))
    out["elapsed"] = time.monotonic() - t0
    return out


cells = []
index = 0
for check in CHECKS:
    for path in PATHS:
        for api in ("tf", "core"):
            if not applies(check, path, api):
                continue
            for who in ("one", "all"):
                cell = {"check": check, "path": path, "api": api, "who": who}
                cell.update(one_cell(check, path, api, who, index))
                # The job still works: a correct allreduce on the world
                # (ranks outside the set too).
                got = tfring.allreduce(tf.constant([rank + 1.0]), op=tfring.Sum,
                                       name=f"after.{index}")
                cell["after"] = float(got.numpy()[0])
                cells.append(cell)
                index += 1
report({"cells": cells})
tfring.shutdown()
sys.exit(0)
