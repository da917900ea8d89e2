"""Elastic training across network-namespace hosts (tests/cluster.py):
3 hosts x 2 ranks, the driver on host1 starting host2 and host3 over ssh.
The training is tests/workers/elastic_train.py; its weights are checked
against the numpy replay of the sizes it ran at (test_elastic.reference)."""

import json
import re
import time

import numpy as np
import pytest

import cluster
from test_elastic import WORKER, reference

_WHY = cluster.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))

FORWARD = ("PYTHONPATH", "OMP_NUM_THREADS", "KILL_HOST", "KILL_STEP", "STEPS", "COMMIT_EVERY",
           "STEP_SLEEP", "FLAG_FILE", "FLAG_STEP")


@pytest.fixture
def three_ssh_hosts():
    cluster.cleanup_leftovers()
    c = cluster.Cluster(3)
    try:
        why = cluster.ssh_unavailable()
        if why:
            pytest.skip(why)
        cluster.start_sshd(c)
        yield c
    finally:
        c.close()


def run_elastic(c, tmp_path, options, timeout=200, cut=None, **env):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("host1:2\nhost2:2\nhost3:2\n")
    e = cluster.launch_env(**{"TFRING_TIMEOUT": 30, **env})
    argv = [cluster.PYTHON, "-m", "tfring.run", "--host-discovery-script", f"cat {hosts}",
            *options]
    for k in FORWARD:
        argv += ["-x", k] if k in e else []
    argv += [cluster.PYTHON, WORKER]
    out = c.hosts[0].run(argv, env=e, cwd=cluster.ROOT, timeout=timeout)
    out.show = f"exit {out.returncode}\nstdout:\n{out.stdout[-4000:]}\nstderr:\n" \
               f"{out.stderr[-6000:]}"
    out.joins = [json.loads(m) for m in re.findall(r"JOIN (\{.*\})", out.stdout)]
    results = [json.loads(m) for m in re.findall(r"RESULT (\{.*\})", out.stdout)]
    out.result = results[-1] if results else None
    return out


def test_host_killed_across_namespace_hosts(three_ssh_hosts, tmp_path):
    out = run_elastic(three_ssh_hosts, tmp_path,
                      ["--min-np", "2", "--max-np", "6", "--elastic-timeout", "60"],
                      KILL_HOST="host2", KILL_STEP=11, STEPS=24, COMMIT_EVERY=2,
                      STEP_SLEEP=0.05)
    assert out.returncode == 0 and out.result, out.show
    sizes = out.result["sizes"]
    assert sizes == [6] * 10 + [4] * 14, (sizes, out.show)
    np.testing.assert_allclose(out.result["w"], reference(sizes), rtol=1e-10, atol=1e-12)
    first = {j["wid"]: j for j in out.joins if j["size"] == 6}
    after = [j for j in out.joins if j["size"] == 4]
    assert len(first) == 6 and len(after) == 4, out.show
    for j in after:
        assert j["pid"] == first[j["wid"]]["pid"] and j["host"] != "host2", out.show
    assert "host host2 blacklisted" in out.stderr, out.show


def test_link_cut_isolates_a_host_and_the_rest_continue(three_ssh_hosts, tmp_path):
    # host3's link goes down mid-training (once rank 0 has reached step 20
    # on 6 ranks): no process dies, its peers just stop answering. The
    # survivors' collectives fail (TFRING_TIMEOUT), they report it, and the
    # driver drops host3 (its ssh sessions time out, or it does not report
    # within the grace period).
    import threading

    c = three_ssh_hosts
    flag, done = tmp_path / "step20", threading.Event()

    def cut_at_step_20():
        while not done.is_set():
            if flag.exists():
                c.hosts[2].link_down()
                return
            time.sleep(0.02)

    cutter = threading.Thread(target=cut_at_step_20, daemon=True)
    cutter.start()
    try:
        out = run_elastic(c, tmp_path, ["--min-np", "2", "--max-np", "6"], STEPS=80,
                          COMMIT_EVERY=2, STEP_SLEEP=0.05, TFRING_TIMEOUT=8,
                          TFRING_ELASTIC_REPORT_GRACE=3, FLAG_FILE=flag, FLAG_STEP=20)
    finally:
        done.set()
        cutter.join(30)
    assert out.returncode == 0 and out.result, out.show
    sizes = out.result["sizes"]
    assert sizes[0] == 6 and sizes[-1] == 4 and set(sizes) == {4, 6}, (sizes, out.show)
    np.testing.assert_allclose(out.result["w"], reference(sizes), rtol=1e-10, atol=1e-12)
    assert "host host3 blacklisted" in out.stderr, out.show
    assert re.search(r"epoch \d+: 4 rank\(s\) \[0:w0@host1 1:w1@host1 2:w2@host2 3:w3@host2\]",
                     out.stderr), out.show
