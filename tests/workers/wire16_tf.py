"""Worker of tests/tf/test_wire16_op.py (2 ranks): Compression.fp16 / bf16
through tfring.allreduce, grouped_allreduce and the RingAllreduce op, eager
and in a tf.function, against numpy float64 and the cast-then-sum path
(Compression.fp16_cast). Reports per check what the test asserts on."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import wire16_ref as ref  # noqa: E402
from common import digest, report  # noqa: E402

import tfring  # noqa: E402

tfring.init()
rank, n = tfring.rank(), tfring.size()
COUNT = 20_001
xs = np.random.default_rng(5).standard_normal((n, COUNT)).astype(np.float32)
exact = xs.astype(np.float64).sum(axis=0)
out = {}

x = tf.constant(xs[rank])
wired = tfring.allreduce(x, op=tfring.Sum, name="w.eager", compression=tfring.Compression.fp16)
cast = tfring.allreduce(x, op=tfring.Sum, name="c.eager",
                        compression=tfring.Compression.fp16_cast)


@tf.function
def in_function(t):
    return (tfring.allreduce(t, op=tfring.Sum, name="w.fn",
                             compression=tfring.Compression.bf16),
            tfring.allreduce(t, op=tfring.Average, name="w.fn.avg",
                             compression=tfring.Compression.fp16))


bf, avg = in_function(x)
out["eager"] = {"dtype": wired.dtype.name, "digest": digest([wired.numpy()]),
                "emulated": bool(np.array_equal(wired.numpy(), ref.ring_wire_sum(xs, "float16"))),
                "in_ring": ref.errors(wired.numpy(), exact, "float16"),
                "cast_then_sum": ref.errors(cast.numpy(), exact, "float16")}
out["function"] = {
    "digest": digest([bf.numpy(), avg.numpy()]),
    "bf16": bool(np.array_equal(bf.numpy(), ref.ring_wire_sum(xs, "bfloat16"))),
    "avg_within": bool((np.abs(avg.numpy() - exact / n)
                        <= ref.ring_bound(xs, "float16", 1.0 / n)).all())}

# Grouped: float32 narrows, float64 goes as float32 on the wire, int32 as it is.
g = tfring.grouped_allreduce(
    [x, tf.constant(xs[rank].astype(np.float64)), tf.constant([rank, 7], tf.int32)],
    op=tfring.Sum, name="w.grouped", compression=tfring.Compression.bf16)
# The two float32 requests are fused into one buffer (submitted together),
# which moves the ring's segments: emulated fused, or each alone.
fused = ref.ring_wire_sum(np.concatenate([xs, xs], axis=1), "bfloat16")
alone = ref.ring_wire_sum(xs, "bfloat16")
out["grouped"] = {
    "dtypes": [t.dtype.name for t in g],
    "f32": any(np.array_equal(g[0].numpy(), want) for want in (fused[:COUNT], alone)),
    "f64": any(np.array_equal(g[1].numpy(), want) for want in (fused[COUNT:], alone)),
    "int": g[2].numpy().tolist(), "digest": digest([t.numpy() for t in g])}

# The gradient of a sum travels on the same wire: d sum(w * allreduce(v)) /
# dv is the sum of every rank's w (w exact in float16, so the sum is too).
w = ref.narrow(np.linspace(0.5, 1.5, 100).astype(np.float32), "float16")
v = tf.Variable(xs[rank][:100])
with tf.GradientTape() as tape:
    y = tfring.allreduce(v, op=tfring.Sum, name="w.grad", compression=tfring.Compression.fp16)
    loss = tf.reduce_sum(y * tf.constant(w))
grad = tape.gradient(loss, v).numpy()
out["grad"] = bool(np.array_equal(grad, n * w))

# The raw op's attribute, and Horovod's compress()/decompress() kept as casts.
op = tfring._collectives.lib.ring_allreduce(tensor=x, reduce_op="sum", tensor_name="w.raw",
                                            wire_dtype="float16")
out["raw_op"] = digest([op.numpy()]) == out["eager"]["digest"]
c, ctx = tfring.Compression.fp16.compress(x)
out["compress"] = [c.dtype.name, tfring.Compression.fp16.decompress(c, ctx).dtype.name]
tfring.shutdown()
report(out)
