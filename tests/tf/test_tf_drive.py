"""Who completes a TF op's collective: the kernel's own thread when every
rank is ready at once (tryDrive after enqueue, csrc/tf/adapter.cc), else
the engine thread; no kernel may hold TF's thread until its collective
finishes. Results against numpy float64 on 2 ranks, eager and in
tf.function, named and unnamed, grouped; a peer far behind; a tf.function
whose collectives every rank launches in its own order on one inter-op
thread; and a mismatch, which must fail on every rank naming the tensor.

This file is also the worker script (run with --worker).
"""

import functools
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
JOB_TIMEOUT = 240
RANK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
            "TFRING_TIMEOUT": "60"}
CHECKS = ["eager_unnamed", "eager_named", "eager_grouped", "function_named",
          "function_unnamed", "peer_far_behind", "many_pending_out_of_order",
          "mismatch_fails_every_rank"]
SIZES = [1, 1000, 262144]  # elements: tiny, 4 KiB-ish, 1 MiB of float32


if __name__ != "__main__":
    from tf_util import tf_available

    pytestmark = pytest.mark.skipif(
        not tf_available(),
        reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")

    _job = []

    def _outcome(check):
        sys.path.insert(0, HERE)
        from multiproc import rank_results, run_ranks

        if not _job:
            _job.append(run_ranks(2, os.path.abspath(__file__), ["--worker"],
                                  env=RANK_ENV, timeout=JOB_TIMEOUT))
        return rank_results(_job[0], check)

    @pytest.mark.parametrize("check", CHECKS)
    def test_check(check):
        outs = _outcome(check)
        failed = [(r, o["error"]) for r, o in enumerate(outs) if o["error"]]
        assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)


# ------------------------------------------------------------- worker side --


def _data(rank, n, salt, dtype="float32"):
    """Per-rank values exact in float32 (multiples of 1/4)."""
    import numpy as np

    rng = np.random.default_rng(1009 * rank + 31 * salt + n)
    return (rng.integers(-64, 65, n) / 4.0).astype(dtype)


def _ref(n, salt, size, dtype="float32"):
    import numpy as np

    return np.sum([_data(r, n, salt, dtype).astype(np.float64) for r in range(size)], axis=0)


def _close(label, got, exp):
    import numpy as np

    got = np.asarray(got, np.float64)
    if got.shape != exp.shape or not np.array_equal(got, exp):
        bad = np.flatnonzero(got != exp)[:5] if got.shape == exp.shape else "shape"
        raise AssertionError(f"{label}: got {got.shape} differing at {bad} from the "
                             f"float64 reference {exp.shape}")


def check_eager_unnamed(tf, tfring, rank, size):
    for i, n in enumerate(SIZES):
        for dtype in ("float32", "float64"):
            x = tf.constant(_data(rank, n, i, dtype))
            for call in range(20):  # back to back: the steady state
                _close(f"eager {dtype} n={n} call {call}",
                       tfring.allreduce(x, op=tfring.Sum).numpy(), _ref(n, i, size, dtype))


def check_eager_named(tf, tfring, rank, size):
    for i, n in enumerate(SIZES):
        x = tf.constant(_data(rank, n, 10 + i))
        for call in range(20):
            got = tfring.allreduce(x, op=tfring.Average, name=f"drive.named.{n}")
            _close(f"eager named n={n} call {call}", got.numpy() * size, _ref(n, 10 + i, size))


def check_eager_grouped(tf, tfring, rank, size):
    xs = [tf.constant(_data(rank, n, 20 + i)) for i, n in enumerate(SIZES * 3)]
    for call in range(10):
        outs = tfring.grouped_allreduce(xs, op=tfring.Sum, name="drive.grouped")
        for i, (o, n) in enumerate(zip(outs, SIZES * 3)):
            _close(f"grouped[{i}] call {call}", o.numpy(), _ref(n, 20 + i, size))


def _function_check(named):
    def check(tf, tfring, rank, size):
        xs = [tf.constant(_data(rank, n, 30 + i)) for i, n in enumerate(SIZES)]
        vs = [tf.Variable(tf.zeros_like(x)) for x in xs]

        @tf.function
        def step():
            for i, (v, x) in enumerate(zip(vs, xs)):
                v.assign(tfring.allreduce(x, op=tfring.Sum,
                                          name=f"drive.fn.{i}" if named else None))
            return tf.constant(0)

        for call in range(20):
            step()
            for i, (v, n) in enumerate(zip(vs, SIZES)):
                _close(f"function[{i}] call {call}", v.numpy(), _ref(n, 30 + i, size))
    return check


check_function_named = _function_check(True)
check_function_unnamed = _function_check(False)


def check_peer_far_behind(tf, tfring, rank, size):
    """One rank arrives 0.3 s late: the other's kernel has returned to TF
    long before, and the engine thread completes the collective."""
    n = 4096
    x = tf.constant(_data(rank, n, 40))
    for call in range(3):
        if rank == 1:
            time.sleep(0.3)
        got = tfring.allreduce(x, op=tfring.Sum, name="drive.late")
        _close(f"late call {call}", got.numpy(), _ref(n, 40, size))

    @tf.function
    def fn(t):
        return tfring.allreduce(t, op=tfring.Sum, name="drive.late.fn")

    for call in range(3):
        if rank == 0:
            time.sleep(0.3)
        _close(f"late fn call {call}", fn(x).numpy(), _ref(n, 40, size))


def check_many_pending_out_of_order(tf, tfring, rank, size):
    """24 allreduces with no dependencies between them in one tf.function,
    created in opposite orders on the two ranks and run on TF's one
    inter-op thread: each kernel may hold that thread only briefly, or the
    ranks would each wait for a collective the other cannot reach."""
    names = [f"drive.ooo.{i}" for i in range(24)]
    order = names if rank % 2 == 0 else names[::-1]
    lens = {nm: SIZES[i % len(SIZES)] for i, nm in enumerate(names)}
    xs = {nm: tf.constant(_data(rank, lens[nm], 50 + i)) for i, nm in enumerate(names)}

    @tf.function
    def run():
        return {nm: tfring.allreduce(xs[nm], op=tfring.Sum, name=nm) for nm in order}

    ring_ops = [op for op in run.get_concrete_function().graph.get_operations()
                 if op.type == "RingAllreduce"]
    assert len(ring_ops) == 24 and not any(op.control_inputs for op in ring_ops)
    t0 = time.perf_counter()
    for call in range(3):
        got = run()
        for i, nm in enumerate(names):
            _close(f"{nm} call {call}", got[nm].numpy(), _ref(lens[nm], 50 + i, size))
    return time.perf_counter() - t0


def check_mismatch_fails_every_rank(tf, tfring, rank, size):
    """Shapes that differ across ranks: every rank's kernel gets the
    error naming the tensor (none hangs)."""
    x = tf.zeros([4 + rank], tf.float32)
    try:
        tfring.allreduce(x, op=tfring.Sum, name="drive.mismatch")
    except tf.errors.FailedPreconditionError as e:
        assert "drive.mismatch" in e.message, e.message
    else:
        raise AssertionError("a shape mismatch across ranks did not fail")
    # The engine still works afterwards.
    _close("after mismatch", tfring.allreduce(tf.constant(_data(rank, 8, 60)), op=tfring.Sum,
                                              name="drive.after").numpy(), _ref(8, 60, size))


def _worker():
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    # One inter-op thread: a kernel that held TF's only pool thread until its
    # collective finished would deadlock the out-of-order checks.
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tfring

    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    sys.path.insert(0, os.path.join(HERE, "workers"))
    from common import report, run_checks

    results = run_checks({name: functools.partial(globals()[f"check_{name}"], tf, tfring,
                                                  rank, size) for name in CHECKS})
    report(results)
    tfring.shutdown()


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker()
