"""Gradient accumulation inside a Keras optimizer's apply (Horovod's
backward_passes_per_step for Keras 3 and tf_keras optimizers).

Every call adds this pass's local gradients to per-variable sums and counts
the pass. The N-th pass reduces the sums over ranks (once, fused like any
step), divides them by N if average_aggregated_gradients, clears the sums
and runs the optimizer's own apply with them. The other passes only advance
optimizer.iterations, as Horovod does, so an iteration-driven learning-rate
schedule sees every pass. The choice is a tf.cond on the pass counter, so
the same code runs eagerly and in a compiled train step; all ranks make the
same choice because they count the same passes.
"""

import tensorflow as tf


def _shape(variable):
    return [int(d) for d in tuple(variable.shape)]


def ensure_built(optimizer, variables):
    """Builds the optimizer's slots before the tf.cond: variables cannot be
    created inside one of its branches."""
    built = getattr(optimizer, "built", None)
    if built is False:              # Keras 3
        optimizer.build(variables)
        optimizer.built = True
    elif built is None and hasattr(optimizer, "build"):
        with tf.init_scope():       # tf_keras: build() is idempotent
            optimizer.build(variables)


class KerasAccumulator:
    """Sums of the local gradients since the last update, per variable."""

    def __init__(self, passes, average):
        self.passes = int(passes)
        self.average = bool(average)
        self.counter = None
        self.sums = {}

    def _sum_for(self, variable, grad):
        key = id(variable)
        if key not in self.sums:
            with tf.init_scope():
                self.sums[key] = tf.Variable(
                    tf.zeros(_shape(variable), grad.dtype), trainable=False,
                    name="tfring_accumulated_gradient")
        return self.sums[key]

    def step(self, optimizer, grads, variables, reduce_fn, apply_fn):
        """reduce_fn(grads, variables) -> reduced grads; apply_fn(grads)
        runs the wrapped optimizer's apply (None entries are skipped)."""
        grads, variables = list(grads), list(variables)
        if len(grads) != len(variables):
            raise ValueError(f"tfring.keras: {len(grads)} gradients for "
                             f"{len(variables)} variables")
        if self.counter is None:
            with tf.init_scope():
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="tfring_backward_passes")
        ensure_built(optimizer, variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        sums = [self._sum_for(variables[i], grads[i]) for i in present]
        updates = []
        for i, s in zip(present, sums):
            g = grads[i]
            updates.append(s.scatter_add(g) if isinstance(g, tf.IndexedSlices)
                           else s.assign_add(tf.cast(g, s.dtype)))
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1)
        boundary = tf.equal(count % self.passes, 0)

        def update():
            reduced = reduce_fn([s.read_value() for s in sums],
                                [variables[i] for i in present])
            if self.average:
                reduced = [r / tf.cast(self.passes, r.dtype) for r in reduced]
            with tf.control_dependencies(reduced):
                cleared = [s.assign(tf.zeros_like(s)) for s in sums]
            full = [None] * len(grads)
            with tf.control_dependencies(cleared):
                for i, r in zip(present, reduced):
                    full[i] = tf.identity(r)
            apply_fn(full)
            return tf.constant(True)

        def skip():
            iterations = getattr(optimizer, "iterations", None)
            if iterations is not None:
                iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            return update() if bool(boundary) else skip()
        return tf.cond(boundary, update, skip)
