"""Graph rewrite: one call makes an existing training program data-parallel.

tf.compat.v1 graphs. Call it once the training graph is built, before the
session starts:

    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
    report = tfring.rewrite()          # the one added line
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())  # + broadcast
        ...

Every gradient that reaches an optimizer's update is rerouted through
RingAllreduce (averaged over ranks by default), dense gradients fused into
few RingGroupedAllreduce ops by size; sparse gradients (tf.IndexedSlices:
embedding lookups, tf.gather) go through RingAllgather, values and indices,
so no rank densifies them. Each global variable's initializer is changed to
assign root_rank's initial value, so running the initializer (however the
program runs it) starts every rank from the same weights; after restoring a
checkpoint instead, run `report.broadcast_op`. Nothing else in the graph
changes: summaries, metrics, evaluation and gradient clipping keep their
local inputs. A second call rewrites only what was added since.

tf.function training steps (TF2). `tfring.rewrite(step)` or `@tfring.rewrite`
returns a function whose optimizer updates receive ring-allreduced
gradients: while the step is traced (or runs eagerly) every Keras 3
optimizer `apply`/`apply_gradients`, tf_keras and tf.compat.v1 optimizer
`apply_gradients` it makes allreduces its gradients first (or, with
`on="tape"`, every GradientTape.gradient result). On the first call the
variables it updates and the optimizer's state are broadcast from
root_rank before the step runs.

This module is the entry point, rewrite(), and makes itself callable (see
_CallableModule). The rest of the package, one concern each: report.py
(RewriteReport), collectives.py (gradient reduction, state broadcast),
graph.py (the tf.compat.v1 graph rewrite, and how it finds the gradients),
step.py (the TF2 step rewrite).
"""

import dataclasses
import sys
import types

import tensorflow as tf

from tfring import Average, basics
from tfring import _collectives
from tfring.compression import Compression

# The parts' public names, and the step-patching depth helpers tfring.keras
# uses, re-exported: `from tfring.rewrite import ...` is as before the split.
from tfring.rewrite.collectives import (  # noqa: F401
    average_scalars,
    broadcast_values,
    reduce_gradients,
)
from tfring.rewrite.graph import SCOPE, _rewrite_graph  # noqa: F401
from tfring.rewrite.report import RewriteReport, RewrittenGradient
from tfring.rewrite.step import RewrittenFunction, _depth, _nested  # noqa: F401

__all__ = [
    "RewriteReport",
    "RewrittenFunction",
    "RewrittenGradient",
    "broadcast_values",
    "reduce_gradients",
    "rewrite",
]


@dataclasses.dataclass
class _Config:
    """The options of one rewrite() call, as the graph and step rewrites
    read them."""
    op: object = Average
    compression: object = Compression.none
    fusion_threshold: object = None
    sparse_as_dense: bool = False
    root_rank: int = 0
    broadcast: bool = True
    on: str = "apply"


# ------------------------------------------------------------ entry point ----

def rewrite(target=None, *, op=Average, compression=Compression.none,
            fusion_threshold=None, sparse_as_dense=False, root_rank=0,
            broadcast=True, on="apply"):
    """Makes an existing training program data-parallel.

    target:
      * None or a tf.Graph (tf.compat.v1): rewrites the graph (default: the
        default graph) in place and returns a RewriteReport. Call it after
        building the training ops and before creating the session.
      * a tf.function or Python function (a TF2 training step; also usable
        as a decorator, `@tfring.rewrite` above or below `@tf.function`):
        returns a RewrittenFunction whose optimizer updates receive
        allreduced gradients; its first call broadcasts the updated
        variables and optimizer state from root_rank.

    op: tfring.Average (default) or tfring.Sum over ranks.
    compression: tfring.Compression.none or .fp16 on the wire.
    fusion_threshold: bytes per fused allreduce op (default: the engine's
        TFRING_FUSION_THRESHOLD, 64 MiB).
    sparse_as_dense (functions only): densify tf.IndexedSlices gradients
        and allreduce them instead of allgathering.
    broadcast: graphs: make variable initializers assign root_rank's
        values; functions: broadcast state before the first step.
    on (functions only): "apply" reduces gradients where an optimizer
        applies them; "tape" reduces every GradientTape.gradient result
        (for steps that update variables by hand).
    """
    if _collectives.reduce_op_name(op) not in ("sum", "average"):
        raise ValueError("tfring.rewrite: gradients are averaged or summed "
                         "over ranks (op=tfring.Average or tfring.Sum)")
    if on not in ("apply", "tape"):
        raise ValueError(f"tfring.rewrite: on must be 'apply' or 'tape', "
                         f"got {on!r}")
    cfg = _Config(op=op, compression=compression,
                  fusion_threshold=fusion_threshold,
                  sparse_as_dense=sparse_as_dense, root_rank=int(root_rank),
                  broadcast=broadcast, on=on)
    if not basics.is_initialized():
        basics.init()
    if target is None or isinstance(target, tf.Graph):
        if target is None:
            if tf.executing_eagerly():
                raise RuntimeError(
                    "tfring.rewrite(): no graph to rewrite (TensorFlow is "
                    "executing eagerly). For a TF2 training step, pass the "
                    "step: step = tfring.rewrite(step), or decorate it with "
                    "@tfring.rewrite; for a tf.compat.v1 graph, call it "
                    "after building the graph, inside graph mode")
            target = tf.compat.v1.get_default_graph()
        return _rewrite_graph(target, cfg)
    if isinstance(target, RewrittenFunction):
        return target
    if callable(target):
        return RewrittenFunction(target, cfg)
    raise TypeError(f"tfring.rewrite: expected a tf.Graph, a tf.function or "
                    f"a function, got {type(target).__name__}")


class _CallableModule(types.ModuleType):
    """`import tfring.rewrite` binds the name tfring.rewrite to this module;
    calling the module calls rewrite(), so `tfring.rewrite(...)` works
    however the name was bound."""

    def __call__(self, *args, **kwargs):
        return rewrite(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
