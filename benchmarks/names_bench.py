#!/usr/bin/env python3
"""What a collective's name costs: 4 KiB allreduce under a fixed name, with
no name (named by call order), and under a new name every call, against
MPI_Allreduce, in the same processes.

    mpirun -np 2 python benchmarks/names_bench.py
    mpirun -np 2 python benchmarks/names_bench.py --size 64K --calls 500

Paths take turns, one loop of --calls calls each per repetition (--reps);
a path's time is the median over repetitions of loop time / calls on each
rank, then the slowest rank. "first unnamed" is the first --calls unnamed
calls of the job, before any repetition.
"""

import argparse
import statistics
import time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4K")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    from _common import parse_size
    from mpi4py import MPI

    import tfring
    from tfring import _core

    comm = MPI.COMM_WORLD
    tfring.init()
    x = np.ones(parse_size(args.size) // 4, np.float32)
    scratch = x.copy()
    fresh = iter(range(1 << 62))

    def loop(fn):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        return (time.perf_counter() - t0) / args.calls

    paths = {
        "named": lambda: _core.allreduce(x, op="sum", name="names.fixed"),
        "unnamed": lambda: _core.allreduce(x, op="sum"),
        "new name": lambda: _core.allreduce(x, op="sum", name=f"names.{next(fresh)}"),
        "MPI": lambda: comm.Allreduce(MPI.IN_PLACE, scratch, op=MPI.SUM),
    }
    first = loop(paths["unnamed"])
    times = {}
    for _ in range(args.reps):
        for k, fn in paths.items():
            times.setdefault(k, []).append(loop(fn))
    worst = {k: max(comm.allgather(statistics.median(v))) for k, v in times.items()}
    first = max(comm.allgather(first))
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.size} float32 allreduce, us per call (x MPI)")
        print(f"  first unnamed {first * 1e6:9.1f}  ({first / worst['MPI']:.2f}x)")
        for k, v in worst.items():
            print(f"  {k:13s} {v * 1e6:9.1f}  ({v / worst['MPI']:.2f}x)")
    tfring.shutdown()


if __name__ == "__main__":
    main()
