"""The TensorFlow ops' GPU kernels.

Always run (TensorFlow and the op library present, no GPU needed):
  - the op library has DEVICE_GPU kernels for every op exactly when its build
    says it registered them (_tfring_ops.so.gpu, written by
    cmake/tensorflow.cmake with the reason), and CPU kernels always;
  - on 2 ranks without a GPU, every op still runs on the CPU with the
    expected results, also when the caller asks for /GPU:0 (soft
    placement), in eager mode and inside tf.function: registering GPU
    kernels changes nothing for host tensors.

Need a GPU that TensorFlow sees and the GPU kernels (skipped otherwise):
every op on GPU tensors on 1 and 2 ranks (both ranks on GPU 0) against
numpy, with outputs left on the GPU, inputs made by GPU work just queued on
TensorFlow's stream (the engine must wait for it), allgather with a
different first dimension per rank (its output is allocated from the
engine's thread), in eager mode and inside tf.function.

This file is also the worker script of those jobs (--worker cpu|gpu).
"""

import importlib.util
import os
import subprocess
import sys
import traceback

import pytest

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
JOB_TIMEOUT = 300
OPS = ("RingAllreduce", "RingGroupedAllreduce", "RingAllgather",
       "RingBroadcast", "RingReducescatter")
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
         "TF_NUM_INTEROP_THREADS": "2", "TFRING_TIMEOUT": "60"}


def _package_dir():
    spec = importlib.util.find_spec("tfring")
    return os.path.dirname(spec.origin) if spec else None


# ------------------------------------------------------------- pytest side --

if __name__ != "__main__":
    from tf_util import tf_available

    pytestmark = pytest.mark.skipif(
        not tf_available(),
        reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")

    def _build_says():
        """('on'|'off', reason) from the build's _tfring_ops.so.gpu."""
        path = os.path.join(_package_dir(), "_tfring_ops.so.gpu")
        try:
            with open(path) as f:
                state, _, why = f.read().strip().partition(": ")
        except OSError:
            return "off", f"{path} is missing (built before GPU kernels existed)"
        return state, why

    _probe_cache = {}

    def _probe():
        """Kernel devices per op and TF's GPUs, from a fresh interpreter (the
        pytest process does not import TensorFlow)."""
        if not _probe_cache:
            code = (
                "import json, tensorflow as tf, tfring.ops\n"
                "from tensorflow.python.framework import kernels\n"
                f"ops = {list(OPS)!r}\n"
                "devs = {op: sorted({k.device_type for k in "
                "kernels.get_registered_kernels_for_op(op).kernel}) for op in ops}\n"
                "gpus = len(tf.config.list_physical_devices('GPU'))\n"
                "print('PROBE' + json.dumps({'devices': devs, 'gpus': gpus}))\n")
            env = dict(os.environ, **QUIET)
            p = subprocess.run([sys.executable, "-c", code], env=env, text=True,
                               capture_output=True, timeout=JOB_TIMEOUT)
            line = [x for x in p.stdout.splitlines() if x.startswith("PROBE")]
            assert p.returncode == 0 and line, (
                f"probe exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\n"
                f"stderr:\n{p.stderr[-3000:]}")
            import json

            _probe_cache.update(json.loads(line[0][len("PROBE"):]))
        return _probe_cache

    def test_cpu_kernels_always_registered():
        for op, devs in _probe()["devices"].items():
            assert "CPU" in devs, (op, devs)

    def test_gpu_kernels_registered_when_built():
        state, why = _build_says()
        if state != "on":
            pytest.skip(f"op library built without GPU kernels: {why}")
        for op, devs in _probe()["devices"].items():
            assert "GPU" in devs, (op, devs, why)

    def test_no_gpu_kernels_when_built_without():
        state, why = _build_says()
        if state == "on":
            pytest.skip(f"op library built with GPU kernels: {why}")
        for op, devs in _probe()["devices"].items():
            assert devs == ["CPU"], (op, devs, why)

    _jobs = {}

    def _job(kind, size):
        """Runs every check of `kind` on `size` ranks once; per-check errors."""
        if (kind, size) not in _jobs:
            sys.path.insert(0, TESTS)
            from multiproc import run_ranks

            env = dict(QUIET)
            if kind == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""
            results = run_ranks(size, os.path.abspath(__file__), ["--worker", kind],
                                env=env, timeout=JOB_TIMEOUT)
            for r in results:
                assert r.returncode == 0 and r.result is not None, (
                    f"rank {r.rank} exited {r.returncode}\nstdout:\n"
                    f"{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}")
            _jobs[(kind, size)] = [r.result for r in results]
        return _jobs[(kind, size)]

    def _assert_check(kind, size, check):
        outs = _job(kind, size)
        failed = [(r, o[check]) for r, o in enumerate(outs) if o[check]]
        assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)

    CPU_CHECKS = ["cpu_eager", "cpu_function", "cpu_asked_for_gpu_eager",
                  "cpu_asked_for_gpu_function"]
    GPU_CHECKS = ["gpu_eager", "gpu_function", "gpu_after_queued_work",
                  "gpu_allgather_uneven", "gpu_grouped_mixed_dtypes"]

    @pytest.mark.parametrize("check", CPU_CHECKS)
    def test_cpu_unchanged(check):
        _assert_check("cpu", 2, check)

    def _require_gpu():
        state, why = _build_says()
        if state != "on":
            pytest.skip(f"op library built without GPU kernels: {why}")
        if not _probe()["gpus"]:
            pytest.skip("no GPU visible to TensorFlow")

    # Ranks sharing GPU 0 (tools/gpu_tf_stage.sh run asks for 1,2,4).
    GPU_SIZES = [int(n) for n in os.environ.get("TFRING_TF_GPU_SIZES", "1,2").split(",")]

    @pytest.mark.parametrize("check", GPU_CHECKS)
    @pytest.mark.parametrize("size", GPU_SIZES)
    def test_gpu(size, check):
        _require_gpu()
        _assert_check("gpu", size, check)


# ------------------------------------------------------------- worker side --
# Everything below runs inside the ranks.

def _inputs(rank, salt, shape=(6, 3)):
    import numpy as np

    rng = np.random.default_rng(7919 * rank + 104729 * salt + 13)
    return (rng.integers(-16, 17, shape) / 4.0).astype(np.float32)


def _all_inputs(size, salt, shape=(6, 3)):
    return [_inputs(r, salt, shape) for r in range(size)]


def _close(label, got, want, device=None, tol=1e-6):
    import numpy as np

    got_arr = got.numpy() if hasattr(got, "numpy") else got
    np.testing.assert_allclose(np.asarray(got_arr, np.float64),
                               np.asarray(want, np.float64), rtol=tol, atol=tol,
                               err_msg=label)
    if device is not None and hasattr(got, "device"):
        assert got.device.endswith(device), f"{label}: output on {got.device}, not {device}"


def _expected(size, rank, salt):
    """This rank's input and the expected output of each op, salted apart."""
    import numpy as np

    xs = _all_inputs(size, salt)
    ys = _all_inputs(size, salt + 1)
    # reducescatter splits dim 0 evenly, the first (dim0 % size) ranks one more.
    n0 = xs[0].shape[0]
    counts = [n0 // size + (1 if r < n0 % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    return {
        "allreduce": (xs[rank], np.mean(xs, axis=0)),
        "grouped": ([xs[rank], ys[rank]], [np.sum(xs, axis=0), np.sum(ys, axis=0)]),
        "allgather": (xs[rank], np.concatenate(xs, axis=0)),
        "broadcast": (xs[rank], xs[size - 1]),
        "reducescatter": (xs[rank], np.sum(xs, axis=0)[start:start + counts[rank]]),
    }


def _run_ops(tf, tfring, inputs, device, mode, tag):
    """Every op on `inputs` (made on `device`); returns their outputs."""
    size = tfring.size()

    def body(a, b1, b2, c, d, e):
        return {
            "allreduce": tfring.allreduce(a, op=tfring.Average, name=f"{tag}.ar"),
            "grouped": tfring.grouped_allreduce([b1, b2], op=tfring.Sum,
                                                name=f"{tag}.gar"),
            "allgather": tfring.allgather(c, name=f"{tag}.ag"),
            "broadcast": tfring.broadcast(d, root_rank=size - 1, name=f"{tag}.bc"),
            "reducescatter": tfring.reducescatter(e, op=tfring.Sum, name=f"{tag}.rs"),
        }

    with tf.device(device):
        args = [tf.constant(inputs["allreduce"][0]),
                tf.constant(inputs["grouped"][0][0]), tf.constant(inputs["grouped"][0][1]),
                tf.constant(inputs["allgather"][0]), tf.constant(inputs["broadcast"][0]),
                tf.constant(inputs["reducescatter"][0])]
        if mode == "function":
            return tf.function(body)(*args)
        return body(*args)


def _check_all(outs, inputs, out_device):
    for op, (_, want) in inputs.items():
        if op == "grouped":
            for i, (g, w) in enumerate(zip(outs[op], want)):
                _close(f"{op}[{i}]", g, w, out_device)
        else:
            _close(op, outs[op], want, out_device)


def _cpu_check(asked_device, mode, salt):
    def check(tf, tfring, rank, size):
        inputs = _expected(size, rank, salt)
        outs = _run_ops(tf, tfring, inputs, asked_device, mode, f"c{salt}")
        _check_all(outs, inputs, "CPU:0")
    return check


def _gpu_check(mode, salt):
    def check(tf, tfring, rank, size):
        inputs = _expected(size, rank, salt)
        outs = _run_ops(tf, tfring, inputs, "/GPU:0", mode, f"g{salt}")
        _check_all(outs, inputs, "GPU:0")
    return check


def check_gpu_after_queued_work(tf, tfring, rank, size):
    """The input is the last of a chain of GPU kernels queued just before the
    op: the engine must read it only once they have run."""
    import numpy as np

    n = 1024
    a = np.random.default_rng(rank).normal(size=(n, n)).astype(np.float32)

    def chain(x):
        y = x
        for _ in range(20):
            y = tf.tanh(tf.linalg.matmul(y, x))
        return y

    with tf.device("/GPU:0"):
        x = tf.constant(a)
        mine = chain(x).numpy()   # the same chain, run to completion
        out = tfring.allreduce(chain(x), op=tfring.Sum, name="queued")
    every = tfring.allgather(tf.constant(mine[None]), name="queued.ref").numpy()
    _close("allreduce after queued work", out, np.sum(every, axis=0), "GPU:0",
           tol=1e-4)


def check_gpu_allgather_uneven(tf, tfring, rank, size):
    import numpy as np

    rows = [r + 1 for r in range(size)]
    xs = [np.full((rows[r], 5), r + 0.5, np.float32) for r in range(size)]
    want = np.concatenate(xs, axis=0)
    with tf.device("/GPU:0"):
        for i in range(3):  # later ones reuse memory the earlier ones freed
            got = tfring.allgather(tf.constant(xs[rank]) * 1.0, name=f"uneven.{i}")
            _close(f"allgather {i}", got, want, "GPU:0")

        @tf.function
        def gather(t):
            return tfring.allgather(t * 2.0, name="uneven.fn")

        _close("allgather in tf.function", gather(tf.constant(xs[rank])), 2 * want, "GPU:0")


def check_gpu_grouped_mixed_dtypes(tf, tfring, rank, size):
    import numpy as np

    dtypes = ["float16", "float32", "float64", "int32", "int64"]
    xs = {d: [np.arange(12).reshape(3, 4).astype(d) + r for r in range(size)]
          for d in dtypes}
    with tf.device("/GPU:0"):
        outs = tfring.grouped_allreduce([tf.constant(xs[d][rank]) for d in dtypes],
                                        op=tfring.Sum, name="mixed")
    for d, got in zip(dtypes, outs):
        assert got.dtype.name == d, (d, got.dtype)
        _close(f"grouped {d}", got, np.sum(xs[d], axis=0), "GPU:0")


CHECKS = {
    "cpu": {
        "cpu_eager": _cpu_check("/CPU:0", "eager", 1),
        "cpu_function": _cpu_check("/CPU:0", "function", 3),
        "cpu_asked_for_gpu_eager": _cpu_check("/GPU:0", "eager", 5),
        "cpu_asked_for_gpu_function": _cpu_check("/GPU:0", "function", 7),
    },
    "gpu": {
        "gpu_eager": _gpu_check("eager", 11),
        "gpu_function": _gpu_check("function", 13),
        "gpu_after_queued_work": check_gpu_after_queued_work,
        "gpu_allgather_uneven": check_gpu_allgather_uneven,
        "gpu_grouped_mixed_dtypes": check_gpu_grouped_mixed_dtypes,
    },
}


def _worker(kind):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    if kind == "gpu":
        for g in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(g, True)
    import tfring

    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    results = {}
    for name, fn in CHECKS[kind].items():
        try:
            fn(tf, tfring, rank, size)
            results[name] = None
        except Exception:  # noqa: BLE001 - reported per check
            results[name] = traceback.format_exc()
    sys.path.insert(0, os.path.join(TESTS, "workers"))
    from common import report

    report(results)
    tfring.shutdown()


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker(sys.argv[sys.argv.index("--worker") + 1])
