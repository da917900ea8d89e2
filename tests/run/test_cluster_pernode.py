"""Per-node launch across hosts for real: one `tfring-run --nnodes ...` per
network-namespace host (tests/cluster.py), no ssh, as Kubernetes starts one
per pod. The ranks' results are checked against numpy float64 and their
layout against the node-major rule; a node that never comes and a rank
that dies must stop every node with an error naming them."""

import os
import subprocess
import time

import pytest

import cluster

_WHY = cluster.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))

TOLERANCE = 1e-5  # float32 sums of standard normals against the float64 sum
PORT = 29431
PER_NODE = 2


@pytest.fixture
def hosts3():
    cluster.cleanup_leftovers()
    c = cluster.Cluster(3)
    yield c
    c.close()


def _env(result_dir, extra=None):
    env = cluster.launch_env(TFRING_RESULT_DIR=result_dir, TFRING_TIMEOUT=30)
    env.update(extra or {})
    return env


def _flags(nnodes, node_rank, master, start_timeout=30):
    return ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--nproc-per-node",
            str(PER_NODE), "--master-addr", master, "--master-port", str(PORT),
            "--start-timeout", str(start_timeout)]


def _launch(host, launcher_args, worker_args, env):
    argv = [cluster.PYTHON, "-m", "tfring.run", *launcher_args, "--timeout", "60",
            cluster.PYTHON, cluster.WORKER, *worker_args]
    return host.popen(argv, env=env, cwd=cluster.ROOT, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True)


def _wait(c, procs, timeout):
    """[(returncode, output)] of every launcher; kills all past timeout."""
    outs = cluster.wait_all(c, procs, timeout)
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def _check_job(result_dir, nnodes, ends):
    for i, (rc, out) in enumerate(ends):
        assert rc == 0, f"node {i} exited {rc}: {out[-3000:]}"
    size = nnodes * PER_NODE
    reps = cluster.read_reports(result_dir, size)
    digests = None
    for r, rep in enumerate(reps):
        assert rep is not None, f"rank {r} wrote no report: {[o[-1500:] for _, o in ends]}"
        assert rep["error"] is None, (r, rep["message"])
        assert (rep["rank"], rep["size"]) == (r, size)
        # node-major: node R runs ranks R*L .. R*L+L-1
        assert (rep["local_rank"], rep["local_size"]) == (r % PER_NODE, PER_NODE), rep
        assert (rep["cross_rank"], rep["cross_size"]) == (r // PER_NODE, nnodes), rep
        assert "tcp" in rep["transport"], rep["transport"]
        for name, (_, err) in rep["results"].items():
            assert err <= TOLERANCE, (r, name, err)
        mine = {k: d for k, (d, _) in rep["results"].items()}
        digests = digests or mine
        assert mine == digests, f"rank {r}'s results differ from rank 0's"


def test_three_nodes_by_flags(hosts3, tmp_path):
    # On hostN:  tfring-run --nnodes 3 --node-rank N-1 --nproc-per-node 2
    #                       --master-addr 10.231.0.1 --master-port P python worker
    master = hosts3.hosts[0].addr
    procs = [_launch(h, _flags(3, i, master), ["collectives"], _env(tmp_path))
             for i, h in enumerate(hosts3.hosts)]
    _check_job(tmp_path, 3, _wait(hosts3, procs, 60))


def test_two_nodes_by_trainer_env(hosts3, tmp_path):
    """No options: the PET_* variables Kubeflow Trainer sets in each pod
    (and a MASTER_PORT that agrees), the nodes started in reverse order."""
    hosts = hosts3.hosts[:2]
    procs = []
    for i in reversed(range(2)):
        env = _env(tmp_path, {"PET_NNODES": "2", "PET_NODE_RANK": str(i),
                              "PET_NPROC_PER_NODE": str(PER_NODE),
                              "PET_MASTER_ADDR": "host1", "PET_MASTER_PORT": str(PORT),
                              "MASTER_PORT": str(PORT), "TFRING_SECRET": "k8s-secret-1"})
        procs.insert(0, _launch(hosts[i], [], ["collectives"], env))
    _check_job(tmp_path, 2, _wait(hosts3, procs, 60))


def test_missing_node_is_named_on_every_node(hosts3, tmp_path):
    """Three nodes expected, node 2 never starts: nodes 0 and 1 stop at the
    start timeout, both naming node rank 2 and the rendezvous address."""
    master = hosts3.hosts[0].addr
    t0 = time.monotonic()
    procs = [_launch(h, _flags(3, i, master, start_timeout=3), ["collectives"], _env(tmp_path))
             for i, h in enumerate(hosts3.hosts[:2])]
    ends = _wait(hosts3, procs, 30)
    assert time.monotonic() - t0 < 25
    for i, (rc, out) in enumerate(ends):
        assert rc == 124, f"node {i} exited {rc}: {out[-2000:]}"
        assert "node rank(s) 2 did not arrive" in out, out[-2000:]
        assert f"{master}:{PORT}" in out, out[-2000:]
    assert cluster.read_reports(tmp_path, 6) == [None] * 6  # no rank started


def test_missing_master_is_named(hosts3, tmp_path):
    """Node 0 never starts: node 1 gives up at the start timeout naming it."""
    master = hosts3.hosts[0].addr
    procs = [_launch(hosts3.hosts[1], _flags(2, 1, master, start_timeout=3),
                     ["collectives"], _env(tmp_path))]
    (rc, out), = _wait(hosts3, procs, 30)
    assert rc == 124, out[-2000:]
    assert f"cannot reach the rendezvous at {master}:{PORT}" in out, out[-2000:]
    assert "missing node rank(s): 0" in out, out[-2000:]


def test_dead_rank_ends_every_node(hosts3, tmp_path):
    """Rank 3 (node 1's second rank) is SIGKILLed mid-allreduce: every
    node's tfring-run exits non-zero, naming rank 3 and node 1."""
    master = hosts3.hosts[0].addr
    env = _env(tmp_path, {"KILL_RANK": "3", "TFRING_SECRET": "k8s-secret-2"})
    t0 = time.monotonic()
    procs = [_launch(h, _flags(2, i, master), ["fault", "allreduce"], env)
             for i, h in enumerate(hosts3.hosts[:2])]
    ends = _wait(hosts3, procs, 60)
    assert time.monotonic() - t0 < 40
    for i, (rc, out) in enumerate(ends):
        assert rc not in (0, 124), f"node {i} exited {rc}: {out[-3000:]}"
        assert "rank 3 on node 1 (host2) was killed by signal SIGKILL" in out, \
            f"node {i}: {out[-3000:]}"


def test_master_name_that_resolves_late(hosts3, tmp_path):
    """As in Kubernetes, where node 0's DNS name exists only once its pod
    does: node 1 starts first with a name no host knows yet, keeps trying,
    and meets node 0 once the name resolves."""
    alias = "node0-not-yet"
    env = _env(tmp_path, {"TFRING_SECRET": "k8s-secret-3"})
    late = _launch(hosts3.hosts[1], _flags(2, 1, alias), ["collectives"], env)
    time.sleep(2.0)
    assert late.poll() is None, late.communicate()[0][-2000:]
    # ip netns exec bind-mounts this file over the host's /etc/hosts: an
    # append (same inode) shows there.
    with open(os.path.join(hosts3.hosts[1].etc, "hosts"), "a") as f:
        f.write(f"{hosts3.hosts[0].addr} {alias}\n")
    first = _launch(hosts3.hosts[0], _flags(2, 0, alias), ["collectives"], env)
    _check_job(tmp_path, 2, _wait(hosts3, [first, late], 60))
