"""Training helpers: the one-line changes that make a TF training step
data-parallel.

    tape = tfring.DistributedGradientTape(tape)       # TF2 / eager
    opt = tfring.DistributedOptimizer(opt)            # tf.compat.v1 optimizers

Both average (op=Average) or sum (op=Sum) each gradient over ranks.
tf.IndexedSlices gradients (embeddings, tf.gather) are allgathered rather
than densified unless sparse_as_dense=True.

backward_passes_per_step=N accumulates gradients locally over N backward
passes and communicates once: the N-th pass allreduces the accumulated sum
(Horovod's default) or, with average_aggregated_gradients=True, the mean
over the N passes, and only that pass applies it.
"""

import tensorflow as tf

from tfring import Average
from tfring.compression import Compression
from tfring.gradient_reduction import (
    GradientReducer,
    check_groups,
    check_passes,
    local_layer_variables,
    resolve_process_set,
    track_compression,
)

__all__ = ["DistributedGradientTape", "DistributedOptimizer",
           "PartialDistributedGradientTape"]



class _Accumulator:
    """Local gradient accumulation over N backward passes, in TF variables and
    tf.cond so it works in eager mode, tf.function and tf.compat.v1 graphs.
    `accumulate` returns the gradients to apply (on the N-th pass the
    reduced sum of the N passes, divided by N if `average`; zeros
    otherwise); `apply` runs the optimizer on the N-th pass only."""

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
        """reduce_fn(values, variables) reduces the accumulated sums."""
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
        present = [i for i, s in enumerate(self.sums) if s is not None]

        def reduce_now():
            sums = [self.sums[i] for i in present]
            reduced = reduce_fn([s.read_value() for s in sums],
                                [variables[i] for i in present])
            if self.average:
                reduced = [r / tf.cast(self.passes, r.dtype) for r in reduced]
            with tf.control_dependencies(reduced):
                cleared = [s.assign(tf.zeros_like(s)) for s in sums]
            with tf.control_dependencies(cleared):
                return [tf.identity(r) for r in reduced]

        def not_yet():
            return [tf.zeros_like(self.sums[i]) for i in present]

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
    all ranks (Horovod's horovod.tensorflow.DistributedGradientTape):

        with tf.GradientTape() as tape:
            loss = ...
        tape = tfring.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    device_dense/device_sparse are accepted and ignored (tfring's engine
    places the collectives); num_groups/groups are validated and left to
    the engine's fusion, which does not change the result.

    With backward_passes_per_step=N (a tfring extension, eager mode only,
    since a new tape is made every step), gradient() accumulates locally
    and returns a None for every source on the first N-1 passes; skip
    applying those: `if grads[0] is not None: opt.apply_gradients(...)`.
    The N-th pass returns the reduced sum of the N passes' gradients, or
    their mean with average_aggregated_gradients=True (Horovod's default is
    the sum). Inside tf.function, accumulate with tfring.DistributedOptimizer
    or the Keras integration instead.

    register_local_source(variable) keeps that variable's gradient on this
    rank (PartialDistributedGradientTape does it for whole layers).
    """

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False,
                 op=Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, process_set=None,
                 scale_local_gradients=True, backward_passes_per_step=1,
                 average_aggregated_gradients=False):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"tfring.DistributedGradientTape wraps a "
                            f"tf.GradientTape, got {type(gradtape).__name__}")
        check_groups(num_groups, groups)
        # Take over the recording (and everything else) of the given tape.
        self.__dict__.update(gradtape.__dict__)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._tfring_reducer = GradientReducer(
            op, compression, sparse_as_dense, gradient_predivide_factor,
            "DistributedGradientTape_Allreduce",
            resolve_process_set(process_set), scale_local_gradients)
        self._tfring_passes = check_passes(backward_passes_per_step)
        self._tfring_average_passes = bool(average_aggregated_gradients)

    def register_local_source(self, source):
        """This source's gradient is not reduced (Horovod's local sources)."""
        self._tfring_reducer.register_local(source)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE,
                 use_generic_names=False):
        grads = super().gradient(target, sources, output_gradients,
                                 unconnected_gradients)
        flat = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        if self._tfring_passes > 1:
            reduced = _accumulate_eager(flat, flat_sources,
                                        self._tfring_passes,
                                        self._tfring_average_passes,
                                        self._tfring_reducer)
        else:
            reduced = self._tfring_reducer.reduce(flat, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target, sources,
                                       output_gradients=None,
                                       use_generic_names=False):
        """([(source, grad)] of the local sources, [(source, grad)] of the
        others), each in the order of `sources`."""
        grads = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if self._tfring_reducer.is_local(s) else shared).append(
                (s, g))
        return local, shared


def PartialDistributedGradientTape(gradtape, device_dense="",
                                   device_sparse="",
                                   compression=Compression.none,
                                   sparse_as_dense=False, op=Average,
                                   gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None,
                                   process_set=None, local_layers=None,
                                   scale_local_gradients=True):
    """A DistributedGradientTape that leaves the gradients of
    `local_layers` (a Keras layer or a list of them) unreduced: each rank
    keeps its own (divided by the number of ranks when
    scale_local_gradients, as Horovod does)."""
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense,
        op, gradient_predivide_factor, num_groups, groups, process_set,
        scale_local_gradients)
    for var in local_layer_variables(local_layers):
        tape.register_local_source(var)
    return tape


# Accumulation state of DistributedGradientTape, which is rebuilt every step:
# kept per list of sources (by identity) and configuration.
_tape_accumulators = {}


def _accumulate_eager(grads, sources, passes, average, reducer):
    if not tf.executing_eagerly():
        raise NotImplementedError(
            "tfring: DistributedGradientTape(backward_passes_per_step > 1) "
            "works in eager mode only; inside tf.function use "
            "tfring.DistributedOptimizer or accumulate explicitly")
    key = (tuple(id(s) for s in sources), passes, average,
           id(reducer.compression), reducer.op_name, reducer.sparse_as_dense,
           reducer.predivide)
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
    reduced = reducer.reduce(sums, sources)
    if average:
        reduced = [None if r is None else r / tf.cast(passes, r.dtype)
                   for r in reduced]
    return reduced


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1 optimizer whose compute_gradients reduces the wrapped
    optimizer's gradients over ranks (see DistributedOptimizer)."""

    def __init__(self, optimizer, name, use_locking, reducer, passes,
                 average_passes):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._reducer = reducer
        # A stateful compressor (PowerSGD) is saved with this optimizer.
        track_compression(self, reducer.compression)
        self._accumulator = None
        if passes > 1:
            self._accumulator = _Accumulator(passes, average_passes, name)

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if self._accumulator is None:
            reduced = self._reducer.reduce(grads, variables)
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


def _is_keras_optimizer(optimizer):
    mod = type(optimizer).__module__ or ""
    return any(mod.startswith(p) for p in ("keras", "tf_keras")) or any(
        (c.__module__ or "").startswith(("keras.", "tf_keras."))
        for c in type(optimizer).__mro__)


def DistributedOptimizer(optimizer, name=None, use_locking=False,
                         device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=None,
                         scale_local_gradients=True):
    """Horovod's horovod.tensorflow.DistributedOptimizer.

    A tf.compat.v1.train optimizer is wrapped so compute_gradients (and so
    minimize) averages (op=Average) or sums (op=Sum) every gradient over all
    ranks before apply_gradients sees it; it works in tf.compat.v1 graphs
    and sessions and in eager mode. A Keras optimizer (Keras 3 or tf_keras)
    goes to tfring.keras.DistributedOptimizer, as Horovod hands it to its
    Keras wrapper.

    backward_passes_per_step=N: gradients are accumulated locally and
    reduced on every N-th call only; apply_gradients updates the variables
    (and global_step) on those calls only. The update uses the sum of the N
    passes' gradients, or their mean with average_aggregated_gradients=True
    (Horovod's semantics).

    device_dense/device_sparse and use_locking (beyond the wrapped
    optimizer's own) are accepted for Horovod compatibility and ignored.
    """
    check_groups(num_groups, groups)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if _is_keras_optimizer(optimizer):
            from tfring.keras.optimizer import DistributedOptimizer as keras_do
            return keras_do(
                optimizer, name=name, device_dense=device_dense,
                device_sparse=device_sparse, compression=compression,
                sparse_as_dense=sparse_as_dense,
                gradient_predivide_factor=gradient_predivide_factor, op=op,
                backward_passes_per_step=backward_passes_per_step,
                average_aggregated_gradients=average_aggregated_gradients,
                groups=groups, process_set=process_set,
                scale_local_gradients=scale_local_gradients)
        raise TypeError(
            f"tfring.DistributedOptimizer wraps tf.compat.v1.train or Keras "
            f"optimizers, got {type(optimizer).__name__}; in a custom "
            f"training loop use tfring.DistributedGradientTape")
    reducer = GradientReducer(op, compression, sparse_as_dense,
                               gradient_predivide_factor,
                               "DistributedOptimizer_Allreduce",
                               resolve_process_set(process_set),
                               scale_local_gradients)
    return _DistributedOptimizer(
        optimizer, name or f"Distributed{type(optimizer).__name__}",
        use_locking, reducer, check_passes(backward_passes_per_step),
        bool(average_aggregated_gradients))
