"""Smoke tests of the training-step benchmarks: keras_scaling.py (tfring
against MultiWorkerMirroredStrategy, its rounds and medians),
entry_points.py (every entry point, profiled) and fused_step_variants.py.
Each runs end to end with tiny sizes and few steps (the rounds against fake
runs); no timing is checked (the numbers are noise at these sizes)."""

import importlib.util
import os
import subprocess
import sys

import pytest
from bench_util import BENCH, TIMEOUT_S, _env, _have_tf_ops, _run, requires_core

pytestmark = requires_core


@pytest.mark.slow  # six TF jobs, about a minute; the rounds' logic below runs without jobs
@pytest.mark.skipif(not _have_tf_ops(), reason="TensorFlow or tfring's op library missing")
def test_keras_scaling_bench_runs_every_configuration(tmp_path):
    # The quick mlp: tfring at 1 and 2 ranks, the same ranks alone, TF's
    # MultiWorkerMirroredStrategy (its workers started on tfring-run's
    # cores), model.fit, and the ratios the exposed-time figures read (each run
    # once; the rounds are checked below without jobs).
    out, res = _run(tmp_path, "keras_scaling.py", "--models", "mlp", "--quick",
                    "--timeout", "240", "--rounds", "1")
    r = res["results"]["mlp"]
    assert all(r[label]["rounds"] == 1 for label in ("tfring x2", "none x2", "mwms x2"))
    for label in ("tfring x1", "tfring x2", "none x2", "mwms x2", "fit x2", "fit none x2"):
        assert r[label]["step_time_s"] > 0 and r[label]["images_per_sec_total"] > 0, label
        assert f"| mlp | 33.5M | {label} |" in out, label
    assert r["gradient_bytes"] == 4 * r["tfring x2"]["params"] and r["core_allreduce_floor_s"] > 0
    assert r["tf_op_allreduce_floor_s"] > 0 and "exposed / TF op floor" in out
    assert r["tfring_over_mwms"] > 0 and "tfring x2 / MWMS x2 throughput" in out


def test_keras_scaling_rounds_alternate_and_keep_the_median(monkeypatch):
    # --rounds: the four 2-rank runs the exposed time compares go in turn,
    # round after round; each keeps its median run (by step time), and the
    # exposed time compares those medians.
    monkeypatch.syspath_prepend(BENCH)  # the script imports benchmarks/_common.py
    spec = importlib.util.spec_from_file_location(
        "keras_scaling", os.path.join(BENCH, "keras_scaling.py"))
    ks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ks)
    calls = []
    steps = {"tfring x2": [0.30, 0.10, 0.20], "none x2": [0.08, 0.09, 0.07],
             "fit x2": [0.5, 0.4, 0.6], "fit none x2": [0.3, 0.3, 0.3]}

    def label_of(np_, backend, args):
        if np_ == 1:
            return "tfring x1"
        fit = "--fit" in args
        return {("tfring", False): "tfring x2", ("none", False): "none x2",
                ("tfring", True): "fit x2", ("none", True): "fit none x2"}[(backend, fit)]

    def fake_tfring(np_, backend, args, timeout, threads=0):
        label = label_of(np_, backend, args)
        calls.append(label)
        step = 0.05 if label == "tfring x1" else steps[label][calls.count(label) - 1]
        return [{"rank": r, "images_per_sec": 32 / step, "step_time_s": step,
                 "threads": 1, "params": 1000} for r in range(np_)]

    def fake_mwms(workers, args, timeout):
        calls.append("mwms x2")
        return [{"rank": r, "images_per_sec": 10.0, "step_time_s": 3.2, "threads": 1,
                 "params": 1000} for r in range(workers)]

    monkeypatch.setattr(ks, "run_tfring", fake_tfring)
    monkeypatch.setattr(ks, "run_mwms", fake_mwms)
    monkeypatch.setattr(ks, "floors", lambda nbytes, timeout: (0.01, 0.02))
    res = ks.bench_model("mlp", [], 60, 2, rounds=3)
    paired = ["tfring x2", "none x2", "fit x2", "fit none x2"]
    assert calls == ["tfring x1", "mwms x2"] + paired * 3
    assert res["tfring x2"]["step_time_s"] == 0.20 and res["none x2"]["step_time_s"] == 0.08
    assert res["fit x2"]["step_time_s"] == 0.5 and res["tfring x2"]["rounds"] == 3
    assert res["tfring x2"]["step_times_s"] == steps["tfring x2"]
    assert res["tfring x2"]["exposed_comm_fraction"] == pytest.approx(1 - 0.08 / 0.20)
    assert res["fit x2"]["exposed_comm_fraction"] == pytest.approx(1 - 0.3 / 0.5)
    assert res["tfring x2"]["exposed_over_floor"] == pytest.approx((0.20 - 0.08) / 0.01)
    assert res["tfring x2"]["exposed_over_tf_floor"] == pytest.approx((0.20 - 0.08) / 0.02)


def test_entry_points_bench(tmp_path):
    # One step per entry point and variant: every entry point trains, its
    # ranks agree, and the table and JSON carry each entry point's times.
    entries = ["tape", "rewrite", "fit", "opt", "v1"]
    out, res = _run(tmp_path, "entry_points.py", "--model", "many", "--layers", "3", "--classes", "10", "--batch-size", "8",
                    "--steps", "1", "--reps", "1", "--entries", ",".join(entries),
                    "--profile-steps", "2")
    assert "ranks ended with the same weights" in out
    assert list(res["entries"]) == entries
    for e, row in res["entries"].items():
        assert row["ranks_agree"], e
        assert row["step_s"] > 0 and row["alone_s"] > 0, row
        assert f"| {e} |" in out
    assert res["gradient_bytes"] > 0 and res["floor_s"] > 0
    # TensorFlow's profiler saw each variant's ops, busy and idle adding up.
    for e in entries:
        for variant in ("tfring", "alone"):
            b = res["profiles"][e][variant]
            assert b["ops"] > 0 and b["busy"] > 0 and b["idle"] >= 0, (e, variant, b)
            assert b["busy"] + b["idle"] == pytest.approx(b["window"], rel=1e-6)


def test_fused_step_variants_bench(tmp_path):
    """Two ranks, a small step: every variant runs, the reduced values are
    checked against numpy inside the script, and rank 0 prints a row per
    use of the outputs."""
    r = subprocess.run(
        [sys.executable, "-m", "tfring.run", "-np", "2", "--timeout", "150", sys.executable,
         os.path.join(BENCH, "fused_step_variants.py"), "--count", "5", "--bytes", "1024",
         "--blocks", "1", "--steps", "2"],
        check=False, cwd=str(tmp_path), env=_env(), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if "| " in line and "---" not in line]
    uses = [row[1].strip() for row in rows[1:]]
    assert uses == ["deps", "sum", "assign", "assign_idn"], r.stdout
