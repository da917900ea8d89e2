"""benchmarks/compression_bench.py without namespaces: its tables from a
made-up result, the skip without root, and one rank script of its
collective sweep under tfring-run on this host (every path's result
checked by the script itself)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from bench_util import BENCH, _env, _have_tf_ops, requires_core

sys.path.insert(0, BENCH)
import compression_bench as cb  # noqa: E402


def test_tables_report_busbw_over_link_and_targets():
    # 4 hosts, 64 MiB in 2.4 s: busbw = 64 MiB / 2.4 s * 1.5 = 335.5 Mbit/s.
    size = 64 << 20
    run = {"rate": 300.0, "link": {"mbit": 280.0}, "np": 4, "rows": [
        {"size": size, "paths": {"core": {"time_s": 2.4}, "fp16": {"time_s": 1.2},
                                 "bf16": {"error": "unavailable"}}}]}
    assert cb.busbw_mbit(size, 2.4, 4) == pytest.approx(335.54, abs=0.01)
    ratio, detail = cb.collective_tables([run], ["core", "fp16", "bf16"])
    assert ratio.splitlines()[-1] == "| 300 | 280 | 4 | 64 MiB | 1.20 | 2.40 | n/a |"
    assert "2400 ms, 336" in detail
    train = {"none": {"step_s": 4.0, "test_accuracy": 0.96, "steps": 100, "fit_s": 400},
             "powersgd": {"step_s": 0.8, "test_accuracy": 0.955, "steps": 100, "fit_s": 80}}
    table = cb.train_table(train)
    assert "| powersgd | 800 ms | 0.20x | 95.5% | -0.5 points |" in table
    verdicts = cb.train_verdicts(train)
    assert "0.20x (target <= 0.25x: met)" in verdicts[0]
    assert "within 1 point: met" in verdicts[1]


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None,
                    reason="root without setpriv: cannot run the script unprivileged")
def test_without_root_it_says_why_and_exits_0():
    drop = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            if os.geteuid() == 0 else [])
    r = subprocess.run([*drop, sys.executable, os.path.join(BENCH, "compression_bench.py")],
                       capture_output=True, text=True, cwd="/", env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "skipped:" in r.stderr and "root" in r.stderr, r.stderr
    assert r.stdout == ""


@requires_core
@pytest.mark.skipif(not _have_tf_ops(), reason="tfring's TensorFlow op library is not built")
def test_collective_sweep_rank_script_on_this_host(tmp_path):
    result = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "tfring.run", "-np", "2", "--timeout", "240", sys.executable,
         os.path.join(BENCH, "_compression_collectives.py"), "--result", str(result),
         "--sizes", "64K", "--reps", "1", "--loop-s", "0.01",
         "--paths", "core,op,fp16,bf16,fp16cast,powersgd"],
        capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(result.read_text())
    assert doc["np"] == 2
    paths = doc["rows"][0]["paths"]
    assert set(paths) == {"core", "op", "fp16", "bf16", "fp16cast", "powersgd"}
    for name, m in paths.items():
        # A path either ran with a checked result or is missing from this build.
        assert "time_s" in m or m["error"].startswith("unavailable"), (name, m)
    for name in ("core", "op", "fp16", "fp16cast"):
        assert paths[name]["time_s"] > 0 and paths[name]["ran"], (name, paths[name])
