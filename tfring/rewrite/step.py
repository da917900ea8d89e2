"""The TF2 rewrite of a training step (tf.function or Python function):
while a RewrittenFunction's step is traced or runs, patched optimizer apply
methods (Keras 3 `apply`/`apply_gradients`, tf_keras and tf.compat.v1
`apply_gradients`) allreduce their gradients first, or, with on="tape",
every GradientTape.gradient result is allreduced; the first call broadcasts
the updated variables and optimizer state from root_rank."""

import contextlib
import functools
import sys
import threading
import warnings

import numpy as np
import tensorflow as tf

from tfring import _core, basics
from tfring.rewrite.collectives import (
    _numpy_of,
    broadcast_values,
    reduce_gradients,
)


class _Context:
    """What one rewritten function saw while it was traced or run."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.variables = []      # variables whose gradients were reduced
        self.optimizers = []     # optimizers whose apply was intercepted
        self.reduced = 0
        self.tape_calls = 0

    def note(self, optimizer, variables):
        if optimizer is not None and all(o is not optimizer
                                         for o in self.optimizers):
            self.optimizers.append(optimizer)
        known = {id(v) for v in self.variables}
        for v in variables:
            if v is not None and id(v) not in known:
                self.variables.append(v)
                known.add(id(v))


_local = threading.local()


def _active():
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _depth():
    return getattr(_local, "depth", 0)


@contextlib.contextmanager
def _activated(ctx):
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.pop()


@contextlib.contextmanager
def _nested():
    _local.depth = _depth() + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _intercept_apply(orig, unpack):
    """Wraps an optimizer apply method: inside an active rewrite context,
    the outermost call reduces its gradients before the original runs."""

    @functools.wraps(orig)
    def apply(self, *args, **kwargs):
        ctx = _active()
        if ctx is None:
            return orig(self, *args, **kwargs)
        if _depth() > 0 or ctx.cfg.on != "apply":
            with _nested():
                return orig(self, *args, **kwargs)
        grads, variables, rebuild = unpack(*args, **kwargs)
        grads = reduce_gradients(grads, ctx.cfg.op, ctx.cfg.compression,
                                 ctx.cfg.fusion_threshold,
                                 ctx.cfg.sparse_as_dense,
                                 variables=_matching(variables, grads))
        # A stateful compressor (PowerSGD) is saved with the optimizer.
        from tfring.gradient_reduction import track_compression
        track_compression(self, ctx.cfg.compression)
        ctx.reduced += sum(g is not None for g in grads)
        ctx.note(self, variables)
        new_args, new_kwargs = rebuild(grads)
        with _nested():
            return orig(self, *new_args, **new_kwargs)

    apply._tfring_original = orig
    return apply


def _matching(variables, grads):
    """The variables of the gradients, when there is one per gradient."""
    variables = list(variables or [])
    return variables if len(variables) == len(grads) else None


def _unpack_grads_and_vars(grads_and_vars, *args, **kwargs):
    pairs = list(grads_and_vars)
    grads = [g for g, _ in pairs]
    variables = [v for _, v in pairs]

    def rebuild(new):
        return (list(zip(new, variables)), *args), kwargs
    return grads, variables, rebuild


def _unpack_grads_vars(grads, trainable_variables=None, *args, **kwargs):
    grads = list(grads)
    variables = (list(trainable_variables)
                 if trainable_variables is not None else [])

    def rebuild(new):
        return (new, trainable_variables, *args), kwargs
    return grads, variables, rebuild


def _patch(cls, name, unpack):
    orig = getattr(cls, name, None)
    if orig is None or getattr(orig, "_tfring_original", None) is not None:
        return
    setattr(cls, name, _intercept_apply(orig, unpack))


def _intercept_gradient(orig):
    @functools.wraps(orig)
    def gradient(self, target, sources, *args, **kwargs):
        result = orig(self, target, sources, *args, **kwargs)
        ctx = _active()
        if ctx is None or _depth() > 0:
            return result
        ctx.tape_calls += 1
        if ctx.cfg.on != "tape":
            return result
        flat = tf.nest.flatten(result)
        reduced = reduce_gradients(flat, ctx.cfg.op, ctx.cfg.compression,
                                   ctx.cfg.fusion_threshold,
                                   ctx.cfg.sparse_as_dense,
                                   variables=_matching(
                                       tf.nest.flatten(sources), flat))
        ctx.reduced += sum(g is not None for g in reduced)
        ctx.note(None, [s for s, g in zip(tf.nest.flatten(sources), reduced)
                        if g is not None])
        return tf.nest.pack_sequence_as(result, reduced)

    gradient._tfring_original = orig
    return gradient


def _install_interceptors():
    """Patches optimizer apply methods once per class (idempotent; the
    patched methods behave as before outside a rewritten function)."""
    if getattr(tf.GradientTape.gradient, "_tfring_original", None) is None:
        tf.GradientTape.gradient = _intercept_gradient(tf.GradientTape.gradient)
    _patch(tf.compat.v1.train.Optimizer, "apply_gradients",
           _unpack_grads_and_vars)
    keras = sys.modules.get("keras")
    if keras is None:
        try:
            import keras
        except ImportError:
            keras = None
    if keras is not None and hasattr(keras, "optimizers"):
        base = keras.optimizers.Optimizer
        _patch(base, "apply_gradients", _unpack_grads_and_vars)
        _patch(base, "apply", _unpack_grads_vars)
        lso = getattr(keras.optimizers, "LossScaleOptimizer", None)
        if lso is not None and "apply" in vars(lso):
            _patch(lso, "apply", _unpack_grads_vars)
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        for cls in (getattr(tf_keras.optimizers, "Optimizer", None),
                    getattr(getattr(tf_keras.optimizers, "legacy", None),
                            "Optimizer", None)):
            if cls is not None:
                _patch(cls, "apply_gradients", _unpack_grads_and_vars)


def _optimizer_variables(opt):
    variables = getattr(opt, "variables", None)
    if callable(variables):  # tf.compat.v1 and tf_keras legacy optimizers
        variables = variables()
    return list(variables or [])


class RewrittenFunction:
    """A training step whose optimizer updates get ring-allreduced
    gradients (see tfring.rewrite). Calls like the function it wraps."""

    def __init__(self, fn, cfg):
        self._cfg = cfg
        self._ctx = _Context(cfg)
        self._synced = False
        python_fn = getattr(fn, "python_function", None)
        self._is_tf_function = python_fn is not None
        if python_fn is None:
            python_fn = fn
        self.python_function = python_fn
        functools.update_wrapper(self, python_fn)
        if self._is_tf_function:
            if getattr(fn, "_jit_compile", None):
                raise NotImplementedError(
                    "tfring.rewrite: the step is compiled with XLA "
                    "(jit_compile=True), which cannot run tfring's "
                    "collectives; jit-compile a function called from the "
                    "step instead")
            autograph = getattr(fn, "_autograph", True)
            body = python_fn
            if autograph:
                try:
                    body = tf.autograph.to_graph(python_fn)
                except Exception:  # noqa: BLE001 - fall back to tracing as is
                    body = python_fn
            kwargs = {"input_signature": fn.input_signature,
                      "autograph": False,
                      "reduce_retracing": getattr(fn, "_reduce_retracing",
                                                  False)}
            self._fn = tf.function(self._wrap(body), **kwargs)
        else:
            self._fn = self._wrap(python_fn)

    def _wrap(self, body):
        ctx = self._ctx

        @tf.autograph.experimental.do_not_convert
        def step(*args, **kwargs):
            _install_interceptors()
            with _activated(ctx):
                result = body(*args, **kwargs)
            if ctx.reduced == 0 and ctx.tape_calls and ctx.cfg.on == "apply":
                warnings.warn(
                    "tfring.rewrite: the step computed gradients but no "
                    "optimizer apply was seen, so nothing was allreduced; "
                    "if it updates variables by hand, use "
                    "tfring.rewrite(step, on='tape')", stacklevel=2)
            return result

        return step

    @property
    def report(self):
        """(variables whose gradients are reduced, optimizers seen)."""
        return list(self._ctx.variables), list(self._ctx.optimizers)

    def _state(self):
        variables = list(self._ctx.variables)
        for opt in self._ctx.optimizers:
            variables += _optimizer_variables(opt)
        return variables

    def _broadcast_ready(self):
        """Broadcasts the state that has values now; returns the rest
        (variables a trace created, initialized when the step first runs)."""
        ready, later = [], []
        for v in self._state():
            try:
                ok = np.shape(_numpy_of(v)) == tuple(v.shape)
            except Exception:  # noqa: BLE001 - not initialized yet
                ok = False
            (ready if ok else later).append(v)
        # Every rank must submit the same broadcasts: agree on the split.
        n = len(ready)
        most, least = _core.allreduce(np.array([n, -n], np.int64), op="max",
                                      name="tfring.rewrite.ready")
        if most != -least:
            later, ready = self._state(), []
        broadcast_values(ready, self._cfg.root_rank,
                         name="tfring.rewrite.broadcast")
        return later

    def _first_call(self, args, kwargs):
        """Broadcasts the step's state from root_rank around its first run:
        before it when the state exists after tracing, else right after."""
        if not tf.executing_eagerly():
            # Traced by an enclosing tf.function: broadcast now, at trace
            # time, which is before the enclosing function first runs.
            result = self._fn(*args, **kwargs)
            with tf.init_scope():
                later = self._broadcast_ready()
            # Optimizer state created by the trace starts equal everywhere.
            model = {id(v) for v in self._ctx.variables}
            later = [v for v in later if id(v) in model]
            if later:
                warnings.warn(
                    f"tfring.rewrite: {len(later)} variables are created "
                    f"inside the step and were not broadcast; build the "
                    f"model before the first step", stacklevel=3)
            return result
        if self._is_tf_function:
            self._fn.get_concrete_function(*args, **kwargs)  # traces
            later = self._broadcast_ready()
            result = self._fn(*args, **kwargs)
        else:
            # An eager step: what it updates is known after one run.
            result = self._fn(*args, **kwargs)
            later = self._state()
        broadcast_values(later, self._cfg.root_rank,
                         name="tfring.rewrite.broadcast_late")
        return result

    def get_concrete_function(self, *args, **kwargs):
        if not self._is_tf_function:
            raise TypeError("tfring.rewrite: the wrapped step is not a "
                            "tf.function")
        return self._fn.get_concrete_function(*args, **kwargs)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args, **kwargs):
        if self._synced:
            return self._fn(*args, **kwargs)
        if not self._cfg.broadcast or basics.size() == 1:
            self._synced = True
            return self._fn(*args, **kwargs)
        result = self._first_call(args, kwargs)
        self._synced = True
        return result

    def __get__(self, instance, owner):
        if instance is None:
            return self
        return functools.partial(self.__call__, instance)
