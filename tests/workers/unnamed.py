"""Unnamed collectives (names made from the call order) on every rank.

argv: "train" or "order".

train: a small linear model trained with plain SGD, each rank on its shard
of a fixed batch; its gradients (a weight matrix and a bias, two shapes)
averaged with unnamed _core.allreduce calls, blocking and async in turn,
40 steps. Reports the weights and those of the same model trained in this
process on the full batch in float64 (the reference), and the time of the
last 20 steps.

order: rank 1 makes two unnamed allreduces of different shapes in the
opposite order to every other rank. Reports the error of the first call
and the result of a correct unnamed call made afterwards.
"""

import sys
import time

import numpy as np
from common import report

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1]
basics.init()
rank, n = basics.rank(), basics.size()

if mode == "train":
    rng = np.random.default_rng(7)
    x = rng.normal(size=(16 * n, 5))
    y = x @ rng.normal(size=(5, 3)) + 0.5
    lr = 0.1

    def grads(w, b, xs, ys):
        err = xs @ w + b - ys  # d(mean squared error)/d(out), up to 2/len
        return 2 * xs.T @ err / len(xs), 2 * err.mean(axis=0)

    w_ref, b_ref = np.zeros((5, 3)), np.zeros(3)
    w, b = np.zeros((5, 3), np.float32), np.zeros(3, np.float32)
    shard = slice(16 * rank, 16 * (rank + 1))
    t_half = None
    for step in range(40):
        if step == 20:
            t_half = time.perf_counter()
        gw_ref, gb_ref = grads(w_ref, b_ref, x, y)
        w_ref, b_ref = w_ref - lr * gw_ref, b_ref - lr * gb_ref
        gw, gb = grads(w.astype(np.float64), b.astype(np.float64), x[shard], y[shard])
        gw, gb = gw.astype(np.float32), gb.astype(np.float32)
        if step % 2:
            gw = _core.allreduce(gw, op="average")
            gb = _core.allreduce(gb, op="average")
        else:
            hw = _core.allreduce_async(gw, op="average")
            hb = _core.allreduce_async(gb, op="average")
            gw, gb = hw.wait(30), hb.wait(30)
        w, b = w - lr * gw, b - lr * gb
    report({"w": w.tolist(), "b": b.tolist(), "w_ref": w_ref.tolist(), "b_ref": b_ref.tolist(),
            "last20_s": time.perf_counter() - t_half})
elif mode == "order":
    shapes = [4, 6] if rank != 1 else [6, 4]
    seen = {"error": None, "message": ""}
    handles = [_core.allreduce_async(np.ones(s, np.float32), op="sum") for s in shapes]
    for h in handles:
        try:
            h.wait(30)
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            if seen["error"] is None:
                seen.update(error=type(e).__name__, message=str(e))
    seen["after"] = _core.allreduce(np.ones(3, np.float32), op="sum").tolist()
    report(seen)
