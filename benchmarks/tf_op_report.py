"""The report of benchmarks/tf_op_bench.py: the paths it times, the
issue's targets, and the tables and summary lines it prints from a run's
result (one world size)."""

from _common import bandwidths, human_size

PATHS = {
    "core": "core",
    "eager": "TF eager",
    "eager_named": "TF eager named",
    "eager_numpy": "TF eager .numpy()",
    "function": "tf.function assigned",
    "function_chain": "tf.function chained, per op",
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
STEP_COUNT = 100  # the training step's tensors
STEP_BYTES = 16 << 10
STEP_PATHS = {"grouped": "grouped_allreduce step", "alone": "TF alone step",
              "mpi": f"{STEP_COUNT} x MPI_Allreduce"}


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
    head += ["eager/core", "named/core", "fn/core", "chained/core", "eager/MPI", "fn/MPI"]
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
                     ("function_chain", "core"), ("eager", "mpi"), ("function", "mpi")):
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
