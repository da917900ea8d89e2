"""A float64 numpy PowerSGD over simulated ranks, written from the paper
(Vogels et al. 2019, Algorithm 1 with error feedback and warm start) and
PyTorch's powerSGD_hook semantics, to check tfring's compressor against.

It holds every rank's state at once: step(grads_by_rank) takes each rank's
gradient list and returns the one result every rank should get."""

import numpy as np


def orthogonalize(mat, eps):
    """Gram-Schmidt on the columns; each divided by (its norm + eps)."""
    mat = np.array(mat, np.float64, copy=True)
    for i in range(mat.shape[1]):
        col = mat[:, i:i + 1]
        col /= np.linalg.norm(col) + eps
        rest = mat[:, i + 1:]
        rest -= np.sum(col * rest, axis=0, keepdims=True) * col
    return mat


class PowerSGDRef:
    """draw(m, r, index, step) -> the fresh (m, r) Q of gradient `index`."""

    def __init__(self, size, draw, rank=4, start_iter=10, min_rate=2.0,
                 warm_start=True, error_feedback=True, eps=0.0):
        self.size = size
        self.draw = draw
        self.rank = rank
        self.start_iter = start_iter
        self.min_rate = min_rate
        self.warm_start = warm_start
        self.error_feedback = error_feedback
        self.eps = eps
        self.errors = [{} for _ in range(size)]
        self.qs = {}
        self.q_ready = False
        self.step_count = 0

    def compressed(self, shape):
        if len(shape) < 2:
            return None
        n, m = shape[0], int(np.prod(shape[1:]))
        r = min(n, m, self.rank)
        return (n, m, r) if (n + m) * r * self.min_rate < n * m else None

    def reset(self):
        self.errors = [{} for _ in range(self.size)]
        self.q_ready = False

    def step(self, grads_by_rank, op="average"):
        scale = self.size if op == "sum" else 1.0
        out = []
        any_compressed = False
        for i in range(len(grads_by_rank[0])):
            gs = [np.asarray(g[i], np.float64) for g in grads_by_rank]
            nmr = self.compressed(gs[0].shape)
            if nmr is None or self.step_count < self.start_iter:
                out.append(np.mean(gs, axis=0) * scale)
                continue
            any_compressed = True
            n, m, r = nmr
            ms = [g.reshape(n, m) + self.errors[k].get(i, 0.0)
                  for k, g in enumerate(gs)]
            if self.warm_start and self.q_ready:
                q = self.qs[i]
            else:
                q = np.asarray(self.draw(m, r, i, self.step_count), np.float64)
            q = orthogonalize(q, self.eps)
            p = orthogonalize(sum(mk @ q for mk in ms), self.eps)
            q = np.mean([mk.T @ p for mk in ms], axis=0)
            approx = p @ q.T
            if self.error_feedback:
                for k, mk in enumerate(ms):
                    self.errors[k][i] = mk - approx
            self.qs[i] = q
            out.append((approx * scale).reshape(gs[0].shape))
        if any_compressed and self.warm_start:
            self.q_ready = True
        self.step_count += 1
        return out
