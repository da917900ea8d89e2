"""Data-parallel SGD with numpy and tfring's core collectives, no framework.

Each rank fits a linear model on its own shard of a synthetic regression
problem; gradients are averaged with a ring allreduce every step, so every
rank keeps identical weights and the run matches one process training on the
whole batch.

    tfring-run -np 2 python examples/numpy_sgd.py
"""

import argparse

import numpy as np

import tfring.basics as tfring
from tfring import _core


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256, help="global batch")
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()

    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    rng = np.random.default_rng(0)  # same problem on every rank
    w_true = rng.normal(size=args.features)
    x_all = rng.normal(size=(args.batch_size * 8, args.features))
    y_all = x_all @ w_true + 0.01 * rng.normal(size=len(x_all))

    # Start from rank 0's weights, whatever each rank initialized.
    w = np.random.default_rng(1000 + rank).normal(size=args.features)
    w = _core.broadcast(w, root=0, name="init.w")
    local = args.batch_size // size
    for step in range(args.steps):
        start = (step * args.batch_size) % len(x_all) + rank * local
        xb, yb = x_all[start:start + local], y_all[start:start + local]
        if step % 50 == 0 and rank == 0:
            loss = float(np.mean((x_all @ w - y_all) ** 2))
            print(f"step {step:4d}  loss {loss:.6f}  (ranks: {size}, "
                  f"transport: {_core.transport()})", flush=True)
        grad = 2.0 * xb.T @ (xb @ w - yb) / local
        grad = _core.allreduce(grad, op="average", name="grad.w")
        w -= args.lr * grad
    same = _core.allreduce(w, op="max", name="check.max")
    assert np.array_equal(same, w), "weights diverged across ranks"
    if rank == 0:
        loss = float(np.mean((x_all @ w - y_all) ** 2))
        print(f"done: loss {loss:.6f}, |w - w_true| = {np.linalg.norm(w - w_true):.2e}; "
              f"weights identical on all {size} ranks")
    tfring.shutdown()


if __name__ == "__main__":
    main()
