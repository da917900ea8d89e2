"""How data-parallel optimizers reduce gradients over ranks: the reducer
that tfring.DistributedGradientTape and tfring.DistributedOptimizer
(tfring/optimizers.py) and tfring.keras's optimizers (tfring/keras/) share,
with the checks of their common options.
"""

import warnings

import tensorflow as tf

from tfring import basics
from tfring import _collectives
from tfring import ops as _ops
from tfring.compression.powersgd import is_powersgd
from tfring.compression.powersgd_step import reduce_step
from tfring.rewrite.collectives import reduce_gradients


class GradientReducer:
    """Allreduces a list of gradients; None entries stay None. Gradients of
    variables registered as local (Partial* wrappers) are not reduced; with
    scale_local_gradients they are divided by the set's size, as Horovod
    does."""

    def __init__(self, op, compression, sparse_as_dense,
                 gradient_predivide_factor, name, process_set=None,
                 scale_local_gradients=True):
        self.op_name = _collectives.reduce_op_name(op)
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
        self.process_set = process_set
        self.scale_local = bool(scale_local_gradients)
        self.local_keys = set()

    def register_local(self, variable):
        self.local_keys.update(var_keys(variable))

    def is_local(self, variable):
        return bool(self.local_keys) and not self.local_keys.isdisjoint(
            var_keys(variable))

    def _op_and_scales(self):
        # Predividing splits the 1/size of an average into a factor applied
        # before the sum (keeps float16 sums in range) and one after it.
        if self.predivide != 1.0:
            return ("sum", 1.0 / self.predivide,
                    self.predivide / set_size(self.process_set))
        return self.op_name, 1.0, 1.0

    def reduce(self, grads, variables=None):
        grads = list(grads)
        if variables is None or not self.local_keys:
            return self._reduce(grads, variables)
        return reduce_skipping_locals(self._reduce, grads, variables,
                                      self.is_local, self.scale_local,
                                      set_size(self.process_set))

    def _reduce(self, grads, variables=None):
        op, pre, post = self._op_and_scales()
        if is_powersgd(self.compression):
            # Every dense gradient of the step goes through the compressor,
            # which keys its state by variable (tfring/compression/).
            with tf.name_scope(self.name):
                return reduce_step(
                    self.compression, grads, variables, op, pre, post,
                    self.process_set, self.sparse_as_dense, name=self.name)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices)
                     else g for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        extra = _set_kwargs(self.process_set)
        out = [None] * len(grads)
        if tf.executing_eagerly() or _collectives.in_xla_context(
                tf.compat.v1.get_default_graph()):
            # One grouped op: every gradient is in flight at once (under
            # XLA too, whose runtime may run separate ops one by one).
            reduced = _ops.grouped_allreduce(
                [grads[i] for i in present], op, name=self.name,
                compression=self.compression, prescale_factor=pre,
                postscale_factor=post, **extra)
        else:
            # Buckets in backprop order (the last sources' gradients first,
            # tfring/_buckets.py): a bucket's op starts as soon as its own
            # gradients exist, so communication overlaps the rest of
            # backprop, and a bucket of many small gradients is one op (one
            # kernel, one hand-off back to TF) instead of one per gradient.
            # Sparse gradients go alone (allgathered, see tfring.allreduce).
            with tf.name_scope(self.name):
                reduced = reduce_gradients(
                    [grads[i] for i in present], op,
                    compression=self.compression, prescale_factor=pre,
                    postscale_factor=post, process_set=self.process_set)
        for i, r in zip(present, reduced):
            out[i] = r
        return out


def track_compression(optimizer, compression):
    """Tracks a stateful compressor (PowerSGD) under `optimizer` (a
    Trackable) as "tfring_powersgd", so a tf.train.Checkpoint of the
    optimizer saves and restores its state; other compressors hold none."""
    if not is_powersgd(compression):
        return
    track = getattr(optimizer, "_track_trackable", None)
    if track is not None:
        track(compression, name="tfring_powersgd", overwrite=True)


def var_keys(variable):
    """Identities of a variable: a Keras 3 variable and the tf.Variable it
    holds both name it, whichever a tape or optimizer is given."""
    keys = {id(variable)}
    inner = getattr(variable, "_value", None)
    if inner is not None:
        keys.add(id(inner))
    return keys


def reduce_skipping_locals(reduce_fn, grads, variables, is_local, scale,
                           set_size):
    """Reduces the gradients of the non-local variables with
    reduce_fn(grads, variables); the local ones stay on this rank (divided
    by set_size when `scale`)."""
    variables = list(variables)
    if len(variables) != len(grads):
        raise ValueError(f"tfring: {len(grads)} gradients for "
                         f"{len(variables)} variables")
    local = [is_local(v) for v in variables]
    shared = [i for i, loc in enumerate(local) if not loc]
    out = list(grads)
    for i, r in zip(shared, reduce_fn([grads[i] for i in shared],
                                      [variables[i] for i in shared])):
        out[i] = r
    if scale:
        for i, loc in enumerate(local):
            g = out[i]
            if not loc or g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                out[i] = tf.IndexedSlices(g.values / float(set_size),
                                          g.indices, g.dense_shape)
            else:
                out[i] = g / tf.cast(set_size, g.dtype)
    return out


def resolve_process_set(process_set):
    """None when gradients are reduced over all ranks (process_set=None or
    the global set); otherwise the set, checked by tfring.process_sets
    (registered, and this rank a member)."""
    if process_set is None:
        return None
    from tfring import process_sets
    if process_sets._process_set_arg(process_set) == 0:
        return None
    return process_set


def _set_kwargs(process_set):
    return {} if process_set is None else {"process_set": process_set}


def set_size(process_set):
    if process_set is None:
        return basics.size()
    size = getattr(process_set, "size")
    return int(size() if callable(size) else size)


def check_groups(num_groups, groups):
    """Horovod's explicit allreduce grouping: validated like Horovod, then
    left to tfring's engine, which fuses whatever gradients are ready (so
    the grouping does not change the result)."""
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list)
                                   or (isinstance(groups, int) and groups > 0)):
        raise ValueError("tfring: groups should be a positive integer or a "
                         "list of lists of tf.Variable")
    return groups


def local_layer_variables(local_layers):
    """The trainable variables of Partial*'s local_layers (a layer or a
    list of layers, Keras 3 or tf_keras)."""
    if local_layers is None:
        return []
    if not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    out = []
    for layer in local_layers:
        weights = getattr(layer, "trainable_weights", None)
        if weights is None:
            raise ValueError(f"tfring: local_layers must be Keras layers, "
                             f"got {type(layer).__name__}")
        out.extend(weights)
    return out


def check_passes(backward_passes_per_step):
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"tfring: backward_passes_per_step must be >= 1, "
                         f"got {backward_passes_per_step}")
    return int(backward_passes_per_step)
