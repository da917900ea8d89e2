"""PowerSGD: low-rank gradient compression with error feedback (Vogels,
Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression
for Distributed Optimization", NeurIPS 2019), with the semantics of
PyTorch's DDP `powerSGD_hook`.

One step, for the dense floating-point gradients of one reduction:

  * warm-up (the first `start_iter` steps): every gradient is allreduced
    as it is;
  * after: each gradient is viewed as a matrix M (n = its first dimension,
    m = the product of the others). Gradients of rank < 2, and those where
    (n + m) * r * min_compression_rate >= n * m, form the uncompressed
    batch, allreduced as they are in one grouped allreduce. For the others:

        M <- M + E                 (error feedback: this rank's residual)
        Q <- orthogonalize(Q)      (the previous step's Q with warm start,
                                    else a fresh random N(0, 1) matrix)
        P <- M Q                   all P's summed in one grouped allreduce
        P <- orthogonalize(P)
        Q <- M^T P                 all Q's averaged in one grouped allreduce
        result = P Q^T             (the rank-r estimate of the mean of M)
        E <- M - P Q^T

    so a step costs two collectives of (n + m) * r words per matrix plus
    the uncompressed batch, instead of n * m words per matrix.

Orthogonalization is Gram-Schmidt on the r columns, each column divided
by (its norm + orthogonalization_epsilon). P is summed, not averaged, as
PyTorch does: orthogonalization removes its scale (exactly so when the
epsilon is 0).

A fresh Q is `tf.random.stateless_normal([m, r], seed=[seed * 65536 + i,
step], dtype)` where i is the gradient's position in the reduction and
step the reduction's step counter, so every rank draws the same Q without
communicating.

State (tf.Variables, created on the first reduction, in the order of the
gradients): per compressed gradient the error E (n x m, rank-local) and
the warm-start Q (m x r, equal on every rank); per reduction (the set of
variables reduced together) the step counter and whether the Q's are
valid. The object is a tf.Module: `tf.train.Checkpoint(..., powersgd=c)`
saves and restores it (tfring's optimizers track it themselves).
"""

import warnings

import tensorflow as tf

from tfring.compression import powersgd_math as _math

_HALF = (tf.float16, tf.bfloat16)


def is_powersgd(compression):
    return isinstance(compression, PowerSGD)


def attached(optimizer):
    """The PowerSGD compressor a tfring optimizer reduces with, or None."""
    for holder in (getattr(optimizer, "_tfring_config", None),
                   getattr(optimizer, "_reducer", None)):
        c = getattr(holder, "compression", None)
        if is_powersgd(c):
            return c
    return None


class _Slot(tf.Module):
    """The state of one compressed gradient: error E and warm-start Q."""

    def __init__(self, n, m, rank, dtype, error_feedback, key):
        super().__init__(name="powersgd_slot")
        self.shape = (n, m)
        self.rank = rank
        self.key = key
        self.q = tf.Variable(tf.zeros([m, rank], dtype), trainable=False,
                             name="q")
        self.error = (tf.Variable(tf.zeros([n, m], dtype), trainable=False,
                                  name="error") if error_feedback else None)


class _Group(tf.Module):
    """The state of one reduction (a set of variables reduced together):
    its step counter, and whether the slots' Q's hold a previous step's."""

    def __init__(self, keys):
        super().__init__(name="powersgd_group")
        self.keys = keys
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                name="step")
        self.q_ready = tf.Variable(False, trainable=False, name="q_ready")


class _Index:
    """State by key: slots by gradient key, groups by their keys."""

    def __init__(self):
        self.slots = {}
        self.groups = {}


class PowerSGD(tf.Module):
    """PowerSGD gradient compression (see the module docstring); made by
    tfring.Compression.powersgd(...). Create it once, outside the training
    loop: it holds the state carried from step to step.

    rank: the rank r of the approximation (PyTorch's
        matrix_approximation_rank; min(n, m, r) per matrix).
    start_iter: steps of plain allreduce before compression starts
        (PyTorch's start_powerSGD_iter).
    min_compression_rate: a matrix is compressed only when its size is more
        than this many times (n + m) * r.
    warm_start: reuse the previous step's Q (else a fresh random Q each
        step).
    use_error_feedback: add the previous step's residual M - P Q^T to the
        gradient before compressing.
    seed: the seed of the random Q's, equal on every rank.
    orthogonalization_epsilon: added to each column's norm before dividing.
    """

    _made = {}  # configuration -> instances made, to warn about per-step use

    def __init__(self, rank=4, start_iter=10, min_compression_rate=2,
                 warm_start=True, use_error_feedback=True, seed=0,
                 orthogonalization_epsilon=0.0, name="powersgd"):
        super().__init__(name=name)
        if int(rank) < 1:
            raise ValueError(f"tfring: PowerSGD rank must be >= 1, got {rank}")
        if int(start_iter) < 0:
            raise ValueError(f"tfring: PowerSGD start_iter must be >= 0, got "
                             f"{start_iter}")
        if float(min_compression_rate) <= 0:
            raise ValueError(f"tfring: PowerSGD min_compression_rate must be "
                             f"> 0, got {min_compression_rate}")
        self.matrix_rank = int(rank)
        self.start_iter = int(start_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = bool(warm_start)
        self.use_error_feedback = bool(use_error_feedback)
        self.seed = int(seed)
        self.epsilon = float(orthogonalization_epsilon)
        self.slots = []
        self.groups = []
        # Lookups by key, kept out of checkpoints (which hold the lists).
        self._index = _Index()
        self._pending_steps = None  # step counters set before they exist
        config = (self.matrix_rank, self.start_iter, self.min_compression_rate,
                  self.warm_start, self.use_error_feedback, self.seed)
        made = PowerSGD._made[config] = PowerSGD._made.get(config, 0) + 1
        if made == 3 and tf.executing_eagerly():
            warnings.warn(
                "tfring: a third PowerSGD compressor with the same settings; "
                "each starts from scratch (warm-up, no error feedback). "
                "Create it once, outside the training loop, and pass the "
                "same object every step", stacklevel=3)

    def __repr__(self):
        return (f"Compression.powersgd(rank={self.matrix_rank}, start_iter="
                f"{self.start_iter}, min_compression_rate="
                f"{self.min_compression_rate:g}, warm_start={self.warm_start}, "
                f"use_error_feedback={self.use_error_feedback}, "
                f"seed={self.seed})")

    # A per-tensor compressor interface, refused: PowerSGD needs every
    # gradient of a step and state per variable across steps.
    def compress(self, tensor):
        raise TypeError(
            "tfring: Compression.powersgd compresses a training step's "
            "gradients together and keeps state per variable across steps, "
            "so it cannot compress one tensor of a collective; pass it to "
            "tfring.DistributedGradientTape, tfring.DistributedOptimizer, "
            "tfring.keras.DistributedOptimizer, RingAllreduceCallback or "
            "tfring.rewrite as compression=")

    def decompress(self, tensor, ctx):
        return self.compress(tensor)

    # ------------------------------------------------------------ state ----

    def should_compress(self, shape):
        """Whether a gradient of this (static) shape is compressed."""
        return _math.should_compress(shape, self.matrix_rank,
                                     self.min_compression_rate)

    def state_variables(self):
        """Every state variable, in creation order."""
        out = []
        for g in self.groups:
            out += [g.step, g.q_ready]
        for s in self.slots:
            out.append(s.q)
            if s.error is not None:
                out.append(s.error)
        return out

    def step_counts(self):
        """The step counter of each reduction, in creation order."""
        return [int(g.step.numpy()) for g in self.groups]

    def set_step_counts(self, counts):
        """Sets the step counters (those not created yet when they are)."""
        counts = list(counts)
        for g, c in zip(self.groups, counts):
            g.step.assign(c)
        self._pending_steps = counts

    def reset(self):
        """Drops the rank-local state: errors become zero and the next step
        draws fresh Q's; the step counters are kept."""
        for g in self.groups:
            g.q_ready.assign(False)
        for s in self.slots:
            s.q.assign(tf.zeros_like(s.q))
            if s.error is not None:
                s.error.assign(tf.zeros_like(s.error))

    def _slot(self, key, n, m, dtype):
        slot = self._index.slots.get(key)
        if slot is None:
            rank = min(n, m, self.matrix_rank)
            with tf.init_scope():
                slot = _Slot(n, m, rank, dtype, self.use_error_feedback, key)
            self.slots.append(slot)
            self._index.slots[key] = slot
        elif slot.shape != (n, m) or slot.q.dtype != dtype:
            raise ValueError(
                f"tfring: PowerSGD holds state for {key[-1]} as a {slot.shape} "
                f"{slot.q.dtype.name} matrix; its gradient is now {(n, m)} "
                f"{dtype.name}")
        return slot

    def _group(self, keys):
        group = self._index.groups.get(keys)
        if group is None:
            with tf.init_scope():
                group = _Group(keys)
                pending = self._pending_steps
                if pending and len(pending) > len(self.groups):
                    group.step.assign(pending[len(self.groups)])
            self.groups.append(group)
            self._index.groups[keys] = group
        return group

    @staticmethod
    def compute_dtype(grad, what):
        dtype = grad.dtype.base_dtype
        if not dtype.is_floating:
            raise TypeError(
                f"tfring: PowerSGD compresses floating-point gradients; "
                f"{what} has a {dtype.name} gradient (reduce it without "
                f"compression)")
        return tf.float32 if dtype in _HALF else dtype
