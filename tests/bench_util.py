"""What the tests of the benchmark scripts share (tests/core/test_bench_*.py):
benchmarks/<script> run with a deadline and its JSON read back, an
environment that finds this tree's tfring, and what the machine offers
(tfring's core, its TensorFlow op library, mpirun and mpi4py)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from mpi_util import have_mpi4py, have_mpirun

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
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
requires_core = pytest.mark.skipif(not _have_core(), reason="tfring's core is not built")


def _env(first_on_path=None, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
    path = [first_on_path] if first_on_path else []
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (*path, os.path.dirname(_tfring_dir()), env.get("PYTHONPATH")) if p
    )
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _run_raw(tmp_path, script, *args, env=None):
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, script), *args],
        check=False,
        cwd=str(tmp_path),
        env=env or _env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _run(tmp_path, script, *args, env=None):
    """Runs benchmarks/<script> ARGS --json; returns (stdout, its JSON)."""
    out = tmp_path / "bench.json"
    r = _run_raw(tmp_path, script, *args, "--json", str(out), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())
