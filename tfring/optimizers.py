"""Training helpers: the one-line changes that make a TF training step
data-parallel.

    tape = tfring.DistributedGradientTape(tape)       # TF2 / eager
    opt = tfring.DistributedOptimizer(opt)            # tf.compat.v1 optimizers

Both average (op=Average) or sum (op=Sum) each gradient over ranks.
tf.IndexedSlices gradients (embeddings, tf.gather) are allgathered rather
than densified unless sparse_as_dense=True.

backward_passes_per_step=N accumulates gradients locally over N backward
passes and communicates once: the N-th pass allreduces the accumulated
gradients (divided by N for op=Average, so the result is the mean over
passes and ranks) and only that pass applies them.
"""

import tensorflow as tf

from tfring import Average, basics
from tfring import ops as _ops
from tfring.compression import Compression

__all__ = ["DistributedGradientTape", "DistributedOptimizer"]


class _GradientReducer:
    """Allreduces a list of gradients; None entries stay None."""

    def __init__(self, op, compression, sparse_as_dense,
                 gradient_predivide_factor, name):
        self.op_name = _ops._reduce_op_name(op)
        if self.op_name not in ("sum", "average"):
            raise ValueError(f"tfring: gradients are averaged or summed over "
                             f"ranks (op=Average or op=Sum), not "
                             f"{self.op_name}")
        if gradient_predivide_factor != 1.0 and self.op_name != "average":
            raise ValueError("tfring: gradient_predivide_factor needs "
                             "op=Average")
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.predivide = float(gradient_predivide_factor)
        self.name = name

    def _op_and_scales(self):
        # Predividing splits the 1/size of an average into a factor applied
        # before the sum (keeps float16 sums in range) and one after it.
        if self.predivide != 1.0:
            return "sum", 1.0 / self.predivide, self.predivide / basics.size()
        return self.op_name, 1.0, 1.0

    def reduce(self, grads):
        grads = list(grads)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices)
                     else g for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        op, pre, post = self._op_and_scales()
        out = [None] * len(grads)
        if tf.executing_eagerly() or _ops._in_xla_context(
                tf.compat.v1.get_default_graph()):
            # One grouped op: every gradient is in flight at once (under
            # XLA too, whose runtime may run separate ops one by one).
            reduced = _ops.grouped_allreduce(
                [grads[i] for i in present], op, name=self.name,
                compression=self.compression, prescale_factor=pre,
                postscale_factor=post)
        else:
            # One op per gradient, so each starts as soon as backprop has
            # produced it and communication overlaps the rest of backprop;
            # the engine fuses those that are ready together.
            with tf.name_scope(self.name):
                reduced = [_ops.allreduce(grads[i], op,
                                          compression=self.compression,
                                          prescale_factor=pre,
                                          postscale_factor=post)
                           for i in present]
        for i, r in zip(present, reduced):
            out[i] = r
        return out


def _check_passes(backward_passes_per_step):
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"tfring: backward_passes_per_step must be >= 1, "
                         f"got {backward_passes_per_step}")
    return int(backward_passes_per_step)


class _Accumulator:
    """Local gradient accumulation over N backward passes, in TF variables and
    tf.cond so it works in eager mode, tf.function and tf.compat.v1 graphs.
    `accumulate` returns the gradients to apply (reduced on the N-th pass,
    zeros otherwise); `apply` runs the optimizer on the N-th pass only."""

    def __init__(self, passes, average, name):
        self.passes = passes
        self.average = average
        self.name = name
        self.counter = None
        self.sums = None
        self.boundary = None

    def _build(self, grads, variables):
        with tf.init_scope():
            self.counter = tf.compat.v1.Variable(
                0, dtype=tf.int64, trainable=False, name=f"{self.name}_passes")
            self.sums = [
                None if g is None else tf.compat.v1.Variable(
                    tf.zeros(v.shape.as_list(), g.dtype), trainable=False,
                    name=f"{self.name}_sum_{i}")
                for i, (g, v) in enumerate(zip(grads, variables))]

    def accumulate(self, grads, variables, reduce_fn):
        if self.sums is None:
            self._build(grads, variables)
        if len(grads) != len(self.sums):
            raise ValueError(f"tfring: backward_passes_per_step accumulates "
                             f"{len(self.sums)} gradients; got {len(grads)}")
        updates = []
        for s, g in zip(self.sums, grads):
            if g is None or s is None:
                continue
            updates.append(s.scatter_add(g) if isinstance(g, tf.IndexedSlices)
                           else s.assign_add(g))
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1)
        self.boundary = tf.equal(count % self.passes, 0)
        present = [s for s in self.sums if s is not None]

        def reduce_now():
            values = [s.read_value() for s in present]
            if self.average:
                values = [v / tf.cast(self.passes, v.dtype) for v in values]
            reduced = reduce_fn(values)
            with tf.control_dependencies(reduced):
                cleared = [s.assign(tf.zeros_like(s)) for s in present]
            with tf.control_dependencies(cleared):
                return [tf.identity(r) for r in reduced]

        def not_yet():
            return [tf.zeros_like(s) for s in present]

        if not present:
            return [None] * len(grads)
        results = iter(tf.cond(self.boundary, reduce_now, not_yet))
        return [None if s is None else next(results) for s in self.sums]

    def apply(self, apply_fn):
        if self.boundary is None:
            raise RuntimeError(
                "tfring: with backward_passes_per_step > 1, apply_gradients "
                "needs the gradients from this optimizer's compute_gradients "
                "(or use minimize)")
        if tf.executing_eagerly():
            return apply_fn() if bool(self.boundary) else None

        def apply_now():
            with tf.control_dependencies([apply_fn()]):
                return tf.constant(True)

        return tf.cond(self.boundary, apply_now,
                       lambda: tf.constant(False)).op


class DistributedGradientTape(tf.GradientTape):
    """Wraps a tf.GradientTape so `gradient()` returns gradients reduced over
    all ranks:

        with tf.GradientTape() as tape:
            loss = ...
        tape = tfring.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    With backward_passes_per_step=N (eager mode only, since a new tape is
    made every step), gradient() accumulates locally and returns a None for
    every source on the first N-1 passes; skip applying those:
    `if grads[0] is not None: opt.apply_gradients(...)`. Inside tf.function,
    accumulate with tfring.DistributedOptimizer (tf.compat.v1) or the Keras
    integration instead.
    """

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False,
                 op=Average, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"tfring.DistributedGradientTape wraps a "
                            f"tf.GradientTape, got {type(gradtape).__name__}")
        # Take over the recording (and everything else) of the given tape.
        self.__dict__.update(gradtape.__dict__)
        self._tfring_reducer = _GradientReducer(
            op, compression, sparse_as_dense, gradient_predivide_factor,
            "DistributedGradientTape_Allreduce")
        self._tfring_passes = _check_passes(backward_passes_per_step)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients,
                                 unconnected_gradients)
        flat = tf.nest.flatten(grads)
        if self._tfring_passes > 1:
            reduced = _accumulate_eager(flat, tf.nest.flatten(sources),
                                        self._tfring_passes,
                                        self._tfring_reducer)
        else:
            reduced = self._tfring_reducer.reduce(flat)
        return tf.nest.pack_sequence_as(grads, reduced)


# Accumulation state of DistributedGradientTape, which is rebuilt every step:
# kept per list of sources (by identity) and configuration.
_tape_accumulators = {}


def _accumulate_eager(grads, sources, passes, reducer):
    if not tf.executing_eagerly():
        raise NotImplementedError(
            "tfring: DistributedGradientTape(backward_passes_per_step > 1) "
            "works in eager mode only; inside tf.function use "
            "tfring.DistributedOptimizer or accumulate explicitly")
    key = (tuple(id(s) for s in sources), passes, id(reducer.compression),
           reducer.op_name, reducer.sparse_as_dense, reducer.predivide)
    state = _tape_accumulators.setdefault(key, {"count": 0, "sums": None})
    dense = [tf.convert_to_tensor(g) if g is not None else None for g in grads]
    if state["sums"] is None:
        state["sums"] = dense
    else:
        state["sums"] = [a if b is None else (b if a is None else a + b)
                         for a, b in zip(state["sums"], dense)]
    state["count"] += 1
    if state["count"] < passes:
        return [None] * len(grads)
    sums = state["sums"]
    del _tape_accumulators[key]
    if reducer.op_name == "average":
        sums = [None if s is None else s / tf.cast(passes, s.dtype)
                for s in sums]
    return reducer.reduce(sums)


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1 optimizer whose compute_gradients reduces the wrapped
    optimizer's gradients over ranks (see DistributedOptimizer)."""

    def __init__(self, optimizer, name, use_locking, reducer, passes):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._reducer = reducer
        self._accumulator = None
        if passes > 1:
            self._accumulator = _Accumulator(
                passes, reducer.op_name == "average", name)

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if self._accumulator is None:
            reduced = self._reducer.reduce(grads)
        else:
            reduced = self._accumulator.accumulate(grads, variables,
                                                   self._reducer.reduce)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._accumulator is None:
            return self._optimizer.apply_gradients(grads_and_vars,
                                                   global_step, name)
        grads_and_vars = list(grads_and_vars)
        return self._accumulator.apply(
            lambda: self._optimizer.apply_gradients(grads_and_vars,
                                                    global_step, name))

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False,
                         device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         op=Average, gradient_predivide_factor=1.0,
                         backward_passes_per_step=1):
    """Wraps a tf.compat.v1.train optimizer: compute_gradients (and so
    minimize) averages (op=Average) or sums (op=Sum) every gradient over all
    ranks before apply_gradients sees it. Works in tf.compat.v1 graphs and
    sessions and in eager mode.

    backward_passes_per_step=N: gradients are accumulated locally and
    reduced on every N-th call only; apply_gradients updates the variables
    (and global_step) on those calls only.

    device_dense/device_sparse are accepted for Horovod compatibility and
    ignored (the collectives run on tfring's engine).
    """
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            f"tfring.DistributedOptimizer wraps tf.compat.v1.train optimizers, "
            f"got {type(optimizer).__name__}; for Keras optimizers use "
            f"tfring.keras.DistributedOptimizer, or tfring.DistributedGradientTape "
            f"in a custom training loop")
    reducer = _GradientReducer(op, compression, sparse_as_dense,
                               gradient_predivide_factor,
                               "DistributedOptimizer_Allreduce")
    return _DistributedOptimizer(
        optimizer, name or f"Distributed{type(optimizer).__name__}",
        use_locking, reducer, _check_passes(backward_passes_per_step))
