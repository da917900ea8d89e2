#!/usr/bin/env python3
"""The same allreduce of a GPU buffer through tfring's core and through its
TensorFlow op, in one job: what the op costs over the core on a device.

    python benchmarks/tf_op_gpu_bench.py                   # 2 ranks on GPU 0
    python benchmarks/tf_op_gpu_bench.py --np 2 --sizes 4K,1M,64M --json out.json

The ranks share GPU 0 (under MPS when its control daemon runs: see
tools/gpu_run.sh's TF_OP_BENCH). In the same processes, size by size, on
float32 buffers holding rank+1, the paths take turns:

- core: ``_core.allreduce(x, op="sum", name=..., out=y)``, x and y
  ``_core.CudaArray`` on the GPU (out of place, as the TF op is);
- eager, eager named: ``tfring.allreduce(t)`` (unnamed, then with
  ``name=``) on a GPU tf.Tensor held by the caller;
- tf.function: ``v.assign(tfring.allreduce(x, ...))`` in a tf.function,
  the result assigned to a GPU variable as an optimizer's update uses it;
- TF alone, eager and tf.function: the same calls with the collective
  replaced by ``tf.raw_ops.Empty`` of the same shape, TensorFlow's own
  cost per call;
- core + TF alone, eager and tf.function: the core's call then the TF-alone
  call in one loop, what the op would cost if it added nothing to the core
  and TensorFlow's own call ("x (core+alone)": the op's time over it).

A loop of k calls ends with one read of the last result's first element
to the host (TF's stream drains before it; the core's call returns only
once the device has finished); the time is the loop's over k, median over
repetitions, the slowest rank's. Each path is checked first: every element
of its result equals n(n+1)/2.

busbw = S/t * 2(N-1)/N in GB/s; "x core" is the path's busbw over the
core's (1: the op costs what the core does).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import bandwidths, child_env, human_size, parse_sizes, run_ranks  # noqa: E402

PATHS = {"core": "core", "eager": "TF eager", "eager_named": "TF eager named",
         "function": "tf.function assigned", "eager_alone": "TF alone eager",
         "function_alone": "TF alone tf.function", "core_eager_alone": "core + TF alone eager",
         "core_function_alone": "core + TF alone tf.function"}
UNCHECKED = ("eager_alone", "function_alone", "core_eager_alone", "core_function_alone")
REFS = {"eager": "core_eager_alone", "eager_named": "core_eager_alone",
        "function": "core_function_alone"}


def worker(args):
    import numpy as np
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise SystemExit("tf_op_gpu_bench: TensorFlow sees no GPU")
    for g in gpus:
        tf.config.experimental.set_memory_growth(g, True)
    import tfring
    from tfring import _core

    tfring.init()
    rank, n = tfring.rank(), tfring.size()
    counter = iter(range(1 << 30))

    def slowest(t):
        return float(_core.allreduce(np.array([t]), op="max", name=f"t.{next(counter)}")[0])

    def barrier():
        _core.allreduce(np.zeros(1), name=f"b.{next(counter)}")

    want = n * (n + 1) / 2
    rows = []
    for size in args.sizes:
        count = size // 4
        host = np.full(count, rank + 1, np.float32)
        x = _core.CudaArray.from_numpy(host, 0)
        y = _core.CudaArray.from_numpy(np.zeros(count, np.float32), 0)
        with tf.device("/GPU:0"):
            t = tf.constant(host)
            v = tf.Variable(tf.zeros([count], tf.float32))

        @tf.function
        def assigned(a, size=size):
            v.assign(tfring.allreduce(a, op=tfring.Sum, name=f"fn.{size}"))
            return v[:1]

        @tf.function
        def alone(a):
            v.assign(tf.raw_ops.Empty(shape=tf.shape(a), dtype=a.dtype))
            return v[:1]

        def core_call(size=size):
            _core.allreduce(x, op="sum", name=f"core.{size}", out=y)
            return y

        def gpu_empty():
            with tf.device("/GPU:0"):
                return tf.raw_ops.Empty(shape=[count], dtype=tf.float32)

        # Each path: (one call, its whole result on the host for the check).
        paths = {
            "core": (core_call, lambda r: r.to_numpy()),
            "eager": (lambda: tfring.allreduce(t, op=tfring.Sum), lambda r: r.numpy()),
            "eager_named": (lambda size=size: tfring.allreduce(t, op=tfring.Sum,
                                                               name=f"e.{size}"),
                            lambda r: r.numpy()),
            "function": (lambda: assigned(t), lambda r: v.numpy()),
            "eager_alone": (gpu_empty, lambda r: None),
            "function_alone": (lambda: alone(t), lambda r: None),
            "core_eager_alone": (lambda: (core_call(), gpu_empty())[1], lambda r: None),
            "core_function_alone": (lambda: (core_call(), alone(t))[1], lambda r: None),
        }
        def head(r):
            """Waits for a TF result: its first element read back (TF's
            stream drains before it)."""
            return float(r[:1].numpy()[0])

        # The core's GPU call returns once the device has finished (host
        # completion): nothing to wait for after it.
        settle = {p: head for p in paths}
        settle["core"] = lambda r: None

        row = {"size": size}
        for path, (call, full) in paths.items():
            ok = True
            if path not in UNCHECKED:
                got = full(call())
                ok = bool(np.all(got == want))
            ok = float(_core.allreduce(np.array([0.0 if ok else 1.0]), op="max",
                                       name=f"ok.{next(counter)}")[0]) == 0.0
            iters = max(1, min(args.iters, int(args.loop_bytes // size)))
            for _ in range(args.warmup):
                settle[path](call())
            times = []
            for _ in range(args.reps):
                barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    r = call()
                settle[path](r)
                times.append((time.perf_counter() - t0) / iters)
            row[path] = {"time_s": slowest(statistics.median(times)), "iters": iters,
                         "correct": ok}
        rows.append(row)
    try:
        backend = _core.gpu_backend()
    except Exception as e:  # noqa: BLE001 - reported in the table's title
        backend = f"unknown ({e})"
    tfring.shutdown()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"np": n, "tf": tf.__version__, "backend": backend, "rows": rows}, f)


def table(report):
    n = report["np"]
    head = ["size"] + [f"{PATHS[p]} ms / GB/s" for p in PATHS if p not in UNCHECKED]
    head += ["eager x core", "named x core", "fn x core", "TF alone eager ms",
             "TF alone fn ms", "eager x (core+alone)", "named x (core+alone)",
             "fn x (core+alone)"]
    lines = [f"### GPU allreduce through the core and the TF op, float32, {n} ranks on "
             f"GPU 0 ({os.environ.get('TFRING_BENCH_MODE', 'sharing unknown')}, "
             f"TensorFlow {report['tf']}, backend {report['backend']})", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in report["rows"]:
        cells = [human_size(row["size"])]
        bw = {}
        for p in PATHS:
            bw[p] = bandwidths(row["size"], row[p]["time_s"], n)[1]
        for p in PATHS:
            if p in UNCHECKED:
                continue
            flag = "" if row[p]["correct"] else " WRONG"
            cells.append(f"{row[p]['time_s'] * 1e3:.3f} / {bw[p]:.1f}{flag}")
        for p in ("eager", "eager_named", "function"):
            cells.append(f"{bw[p] / bw['core']:.2f}")
        cells += [f"{row[p]['time_s'] * 1e3:.3f}" for p in ("eager_alone", "function_alone")]
        cells += [f"{row[p]['time_s'] / row[REFS[p]]['time_s']:.2f}"
                  for p in ("eager", "eager_named", "function")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K,1M,16M,64M,256M"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=50, help="calls per timed loop, at most")
    p.add_argument("--loop-bytes", type=float, default=2e9,
                   help="bytes per timed loop, at most (sets the loop at large sizes)")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--json", default="")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    env = child_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Launched from an empty folder: `-m tfring.run` puts the working
    # directory first on sys.path, and a checkout there has no build.
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "tfring.run", "-np", str(args.np), "--timeout",
               str(args.timeout), sys.executable, os.path.abspath(__file__), "--worker",
               "--result", result, *sys.argv[1:]]
        code, report = run_ranks(cmd, env, result, args.timeout + 60, "tf_op_gpu_bench",
                                 cwd=tmp)
    if report is None:
        return code
    print(table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
