"""Rank worker for tests/core/test_validation.py: allgather, broadcast and
alltoall on every dtype Horovod's ops take (HorovodAllgather,
HorovodBroadcast, HorovodAlltoall), through the TF ops (eagerly and, where
the op has an XLA form, under jit_compile) and the numpy `_core`, against
numpy references built from every rank's input. Reports {"failures": [...]}.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from common import compare, report

import tfring
from tfring import _core

tf.config.threading.set_intra_op_parallelism_threads(1)

DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32",
          "float64", "bool"]

tfring.init()
rank, size = tfring.rank(), tfring.size()
failures = []


def data(r, dt, rows):
    """Rank r's input: rows x 3, distinct per rank, within every dtype."""
    v = (np.arange(rows * 3).reshape(rows, 3) * 7 + 11 * r) % 100
    if dt == "bool":
        return (v % 3 == 0)
    if dt.startswith("int"):
        v = v - 50  # negative values too
    return v.astype(dt)


def rows_of(r):
    return r + 1  # allgather: rows differ by rank


for dt in DTYPES:
    mine = data(rank, dt, rows_of(rank))
    want_ag = np.concatenate([data(r, dt, rows_of(r)) for r in range(size)])
    root = size - 1
    want_bc = data(root, dt, 2)
    # alltoall: rank r sends q + 1 rows to rank q.
    splits = [q + 1 for q in range(size)]
    a2a_in = {r: data(r, dt, sum(splits)) for r in range(size)}
    off = sum(splits[:rank])
    want_a2a = np.concatenate([a2a_in[r][off:off + splits[rank]] for r in range(size)])

    def each(what, fn, want):
        try:
            got = fn()
        except Exception as e:  # noqa: BLE001 - recorded for the test
            failures.append(f"{what} {dt}: {type(e).__name__}: {str(e)[:300]}")
            return
        got = np.asarray(got)
        if got.dtype != want.dtype:
            failures.append(f"{what} {dt}: dtype {got.dtype} != {want.dtype}")
        compare(failures, f"{what} {dt}", got, want, 0)

    each("tf allgather", lambda: tfring.allgather(tf.constant(mine), name=f"ag.{dt}").numpy(),
         want_ag)
    each("tf broadcast", lambda: tfring.broadcast(tf.constant(data(rank, dt, 2)),
                                                  root_rank=root, name=f"bc.{dt}").numpy(),
         want_bc)
    each("tf alltoall", lambda: tfring.alltoall(tf.constant(a2a_in[rank]), splits=splits,
                                                name=f"a2a.{dt}")[0].numpy(), want_a2a)
    # XLA's allgather needs the same rows on every rank.
    same = data(rank, dt, 2)
    each("xla allgather",
         lambda: tf.function(lambda t: tfring.allgather(t, name=f"xag.{dt}"),
                             jit_compile=True)(tf.constant(same)).numpy(),
         np.concatenate([data(r, dt, 2) for r in range(size)]))
    each("xla broadcast",
         lambda: tf.function(lambda t: tfring.broadcast(t, root_rank=root, name=f"xbc.{dt}"),
                             jit_compile=True)(tf.constant(same)).numpy(), want_bc)
    each("core allgather", lambda: _core.allgather(mine, name=f"cag.{dt}"), want_ag)
    each("core broadcast", lambda: _core.broadcast(data(rank, dt, 2), "sum", f"cbc.{dt}", root),
         want_bc)
    each("core alltoall", lambda: _core.alltoall(a2a_in[rank], splits, name=f"ca2a.{dt}")[0],
         want_a2a)

report({"failures": failures})
tfring.shutdown()
sys.exit(0)
