#!/usr/bin/env python3
"""Allreduce algorithms side by side with MPI_Allreduce, in the same processes.

    python benchmarks/algo_bench.py --np 2,4 --sizes 256,4K,64K,1M
    mpirun -np 2 python benchmarks/algo_bench.py          # one world size

For each size, float32 sum, in place, taking turns loop by loop (timing as in
allreduce_bench.py: median over repetitions of barrier-started loops, max over
ranks; a second table gives each column's fastest loop), the columns are:

- ``mpi``: ``comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``;
- ``ring`` / ``oneshot`` / ``hier``: ``_core_testing.DirectAllreduce.allreduce(buf,
  algo)``, the algorithm alone: its own ring links and host segment, no
  engine, no negotiation (one Python call per collective, like mpi4py);
- ``engine``: ``_core.allreduce(buf, out=buf)``, the full path through the
  engine with the algorithm TFRING_ALLREDUCE_ALGO selects (default auto).

With ``--hosts K`` the ranks pretend to sit on K hosts (TFRING_HOSTNAME), so
``oneshot`` runs the small cross-host scheme and ``hier`` the hierarchical one.
TFRING_SMALL_THRESHOLD (default here: the largest size swept) sizes the host
segment, so the one-shot column moves every size in one step.
"""

import argparse
import json
import os
import secrets
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    MpiSync,
    child_env,
    human_size,
    in_mpi_job,
    mpi_module,
    parse_ints,
    parse_sizes,
    run_ranks,
    time_collectives,
)


def worker(args):
    import numpy as np
    from mpi4py import MPI

    import tfring
    from tfring import _core, _core_testing

    comm = MPI.COMM_WORLD
    sync = MpiSync(comm)
    rank, n = comm.Get_rank(), comm.Get_size()
    if args.hosts > 1:  # simulated hosts: consecutive ranks share one
        os.environ["TFRING_HOSTNAME"] = f"host{rank * args.hosts // n}"
    tmp = comm.bcast(tempfile.mkdtemp(prefix="tfring-algo-") if rank == 0 else None)
    secret = comm.bcast(secrets.token_hex(16) if rank == 0 else None)
    direct = _core_testing.DirectAllreduce(_core.FileStore(tmp), rank, n, secret)
    tfring.init()
    algos = [a for a in args.algos.split(",") if a]
    rows = []
    for size in args.sizes:
        count = size // 4
        ops, bufs = {}, {}
        want = n * (n + 1) / 2
        for a in algos:
            buf = bufs[a] = np.full(count, rank + 1, np.float32)
            direct.allreduce(buf, a)
            assert np.all(buf == want), (a, size)
            ops[a] = lambda buf=buf, a=a: direct.allreduce(buf, a)
        if not args.no_engine:
            eb = np.full(count, rank + 1, np.float32)
            _core.allreduce(eb, op="sum", name=f"e.{size}", out=eb)
            assert np.all(eb == want)
            ops["engine"] = lambda eb=eb, size=size: _core.allreduce(
                eb, op="sum", name=f"e.{size}", out=eb)
        mb = np.full(count, rank + 1, np.float32)
        ops["mpi"] = lambda mb=mb: comm.Allreduce(MPI.IN_PLACE, mb, op=MPI.SUM)
        timed = time_collectives(sync, ops, args.warmup, args.reps, args.iters)
        row = {"np": n, "size": size}
        for k, m in timed.items():
            row[k] = m["time_s"]
            row[k + "_min"] = m["min_s"]
        row["engine_algo"] = direct.algorithm(size)
        rows.append(row)
    tfring.shutdown()
    direct.close()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump(rows, f)
    return 0


def table(rows, algos, engine, key=""):
    cols = algos + (["engine"] if engine else []) + ["mpi"]
    rows = [dict(r, **{c: r[c + key] for c in cols}) for r in rows]
    out = ["| np | size | " + " | ".join(f"{c} (us)" for c in cols)
           + " | " + " | ".join(f"{c}/mpi" for c in cols[:-1]) + " |",
           "|---:|---:|" + "---:|" * (2 * len(cols) - 1)]
    for r in rows:
        t = [r[c] * 1e6 for c in cols]
        out.append(f"| {r['np']} | {human_size(r['size'])} | "
                   + " | ".join(f"{x:.1f}" for x in t) + " | "
                   + " | ".join(f"{r[c] / r['mpi']:.2f}" for c in cols[:-1]) + " |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=parse_ints, default=[2, 4])
    p.add_argument("--sizes", type=parse_sizes,
                   default=parse_sizes("256,1K,4K,16K,32K,64K,128K,256K,1M"))
    p.add_argument("--algos", default="ring,oneshot")
    p.add_argument("--no-engine", action="store_true")
    p.add_argument("--hosts", type=int, default=1,
                   help="simulate this many hosts (TFRING_HOSTNAME), ranks split evenly")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--result")
    args = p.parse_args()
    os.environ.setdefault("TFRING_SMALL_THRESHOLD", str(max(args.sizes)))
    if args.worker or in_mpi_job():
        if not args.result:
            args.result = os.path.join(tempfile.mkdtemp(), "r.json")
        rc = worker(args)
        if not args.worker and int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == 0:
            with open(args.result) as f:
                print(table(json.load(f), args.algos.split(","), not args.no_engine))
        return rc
    mpi = mpi_module()
    mpirun = mpi.find_mpirun()
    if mpirun is None:
        print("algo_bench: no mpirun found", file=sys.stderr)
        return 2
    env = mpi.mpirun_env(child_env())
    all_rows = []
    for n in args.np:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            cmd = mpi.mpirun_command(n, [
                   sys.executable,
                   os.path.abspath(__file__), "--worker", "--result", result,
                   "--sizes", ",".join(map(str, args.sizes)), "--algos", args.algos,
                   "--warmup", str(args.warmup), "--reps", str(args.reps),
                   "--iters", str(args.iters), "--hosts", str(args.hosts)]
                   + (["--no-engine"] if args.no_engine else []),
                   mpirun=mpirun)
            rc, rows = run_ranks(cmd, env, result, args.timeout, f"np={n}")
            if rows is None:
                return rc
            all_rows += rows
    print(table(all_rows, args.algos.split(","), not args.no_engine))
    print("\nfastest loop per column (less disturbed by other load):")
    print(table(all_rows, args.algos.split(","), not args.no_engine, "_min"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
