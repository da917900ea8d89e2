"""benchmarks/cluster_bench.py end to end on two unshaped namespace hosts:
every algorithm job runs, checks its results exactly against the expected
sum (a wrong sum fails the job) and runs the algorithm it was asked for."""

import json
import os
import subprocess
import sys

import pytest

import cluster

BENCH = os.path.join(cluster.ROOT, "benchmarks", "cluster_bench.py")
_WHY = cluster.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def test_cluster_bench_two_hosts(tmp_path):
    out_json = tmp_path / "r.json"
    p = subprocess.run([sys.executable, BENCH, "--rate", "0", "--sizes", "64K",
                        "--reps", "1", "--warmup", "1", "--json", str(out_json)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    if "skipped:" in p.stderr:
        pytest.skip(p.stderr.strip())
    assert "| 64 KiB |" in p.stdout, p.stdout
    jobs = json.load(open(out_json))["jobs"]
    assert set(jobs) == {"ring", "hier", "auto"}
    for algo in ("ring", "hier"):
        assert jobs[algo]["np"] == 4
        assert [r["ran"] for r in jobs[algo]["rows"]] == [[algo]], jobs[algo]
    # Above the default 32 KiB threshold, across equal hosts, auto is hier.
    assert jobs["auto"]["rows"][0]["ran"] == ["hier"], jobs["auto"]
