"""Many hosts: H network-namespace hosts of L core-only ranks each (no
TensorFlow), started with the env-var bootstrap. The `cluster_hosts`
fixture takes (H, L) by indirect parametrisation, up to 32 x 4, and removes
every namespace and process whatever the test does. CI runs 8 x 4;
TFRING_TEST_SLOW=1 adds 32 x 4 (128 ranks), the last host's link cut at
16 x 4 and 32 x 4, and a rank killed on the last host of 32. A failure
must be named first in every survivor's error: the failed rank, not the
rank that noticed it."""

import os
import signal
import tempfile
import time

import pytest

import cluster
from multiproc import first_rank_named

_WHY = cluster.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))
SLOW = bool(os.environ.get("TFRING_TEST_SLOW"))
# float32 sums of up to 128 standard normals against the float64 sum.
TOLERANCE = 1e-4


class Job:
    """The hosts of one cluster and how to start L ranks on each."""

    def __init__(self, c, per_host):
        self.cluster, self.per_host = c, per_host
        self.size = per_host * len(c.hosts)
        self.dir = tempfile.mkdtemp(prefix="tfring-scale-")

    def start(self, args, env=None):
        # auto, not the workers' default ring: the algorithms chosen at scale.
        env = dict({"CLUSTER_ALGO": "auto", "TFRING_TIMEOUT": "120"}, **(env or {}))
        _, procs = cluster.start_ranks(self.cluster, self.per_host, args, self.dir, env=env)
        return procs

    def reports(self):
        return cluster.read_reports(self.dir, self.size)


@pytest.fixture
def cluster_hosts(request):
    hosts, per_host = request.param
    assert hosts <= 32 and per_host <= 8, "the subnet and this machine's patience"
    cluster.cleanup_leftovers()
    c = cluster.Cluster(hosts)
    try:
        yield Job(c, per_host)
    finally:
        c.close()


def _check_collectives(job, outs):
    reps = job.reports()
    digests = {}
    for r, rep in enumerate(reps):
        assert rep is not None, f"rank {r} wrote no report: {outs[r][-1500:]}"
        assert rep["error"] is None, (r, rep["message"])
        assert (rep["rank"], rep["size"]) == (r, job.size)
        assert (rep["local_rank"], rep["local_size"]) == (r % job.per_host, job.per_host)
        assert (rep["cross_rank"], rep["cross_size"]) == (r // job.per_host,
                                                          len(job.cluster.hosts))
        for name, (digest, err) in rep["results"].items():
            assert err <= TOLERANCE, (r, name, err)
            digests.setdefault(name, set()).add(digest)
    # Every rank ends every collective with the same bytes.
    assert {k: len(v) for k, v in digests.items() if len(v) > 1} == {}


@pytest.mark.parametrize("cluster_hosts", [(8, 4)] + ([(32, 4)] if SLOW else []),
                         indirect=True, ids=lambda p: f"{p[0]}x{p[1]}")
def test_collectives_on_many_hosts(cluster_hosts):
    job = cluster_hosts
    procs = job.start(["collectives"])
    outs = cluster.wait_all(job.cluster, procs, 300 if job.size <= 32 else 900)
    _check_collectives(job, outs)


def _start_fault_stream(job, env):
    """Starts every rank in a stream of small allreduces and returns once
    all are in it (half a second after the last is ready)."""
    procs = job.start(["fault", "allreduce"], env=dict({"FAULT_ELEMS": "1024"}, **env))
    deadline = time.monotonic() + 600
    while sum(f.endswith(".ready") for f in os.listdir(job.dir)) < job.size:
        assert time.monotonic() < deadline, "the job did not start"
        assert all(p.poll() is None for p in procs), "a rank died during start-up"
        time.sleep(0.2)
    time.sleep(0.5)
    return procs


@pytest.mark.skipif(not SLOW, reason="128 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("cluster_hosts", [(32, 4)], indirect=True, ids=["32x4"])
def test_killed_rank_on_the_last_host_is_named_by_every_survivor(cluster_hosts):
    job = cluster_hosts
    victim = job.size - 1
    procs = _start_fault_stream(job, {})
    t_kill = time.time()
    os.kill(procs[victim].pid, signal.SIGKILL)
    cluster.wait_all(job.cluster, procs[:victim], 120)
    bad = []
    for r, rep in enumerate(job.reports()[:victim]):
        if rep is None or first_rank_named(rep["message"]) != victim:
            bad.append((r, rep and rep["message"][:200]))
        else:
            assert rep["t_error"] - t_kill < 10, (r, rep["t_error"] - t_kill)
    assert bad == [], bad


@pytest.mark.skipif(not SLOW, reason="64-128 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("cluster_hosts", [(16, 4), (32, 4)], indirect=True, ids=["16x4", "32x4"])
def test_cut_link_of_the_last_host_is_named_by_every_rank(cluster_hosts):
    # The last host's link to the switch goes down mid-stream: no process
    # dies, a link does. Every rank must fail within the bound, and name
    # the other side: ranks elsewhere a rank (or the address) of the cut
    # host, ranks on the cut host one elsewhere. No hangs.
    job = cluster_hosts
    cut = job.cluster.hosts[-1]
    cut_ranks = set(range(job.size - job.per_host, job.size))
    procs = _start_fault_stream(job, {"TFRING_TIMEOUT": "30"})
    t_cut = time.time()
    cut.link_down()
    cluster.wait_all(job.cluster, procs, 120)
    bad = []
    for r, rep in enumerate(job.reports()):
        if rep is None or not rep.get("error"):
            bad.append((r, "no error reported"))
            continue
        first = first_rank_named(rep["message"])
        other = cut_ranks if r not in cut_ranks else set(range(job.size)) - cut_ranks
        if not (first in other or (r not in cut_ranks and cut.addr in rep["message"])):
            bad.append((r, rep["message"][:200]))
        elif rep["t_error"] - t_cut > 40:
            bad.append((r, f"error after {rep['t_error'] - t_cut:.1f} s"))
    assert bad == [], bad
