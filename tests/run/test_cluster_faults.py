"""CI-sized subset of the fault table (tests/cluster_faults.py runs the
full one): one trial per scenario, the fault at a random point, every wait
bounded. Survivors on both hosts must raise an error naming the failed rank
or host within 10 s (dead process, cut link) and exit non-zero; no hangs."""

import random
import warnings

import pytest

import cluster
import cluster_faults

_WHY = cluster.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))

CI_SCENARIOS = [
    "kill rank on host1, allreduce",
    "kill rank on host2, allgather",
    "kill rank on host2, broadcast",
    "kill rank on host1, negotiation",
    "link cut mid-transfer",
    "store host dies during start-up",
]


def _trial(scenario, seed):
    cluster.cleanup_leftovers()
    with cluster.Cluster(2) as c:
        return cluster_faults.trial(c, scenario, random.Random(seed))


@pytest.mark.parametrize("scenario", CI_SCENARIOS)
def test_fault_fails_every_survivor_fast(scenario):
    res = _trial(scenario, hash(scenario) % 1000)
    assert not res["hang"], res["problems"]
    assert res["ok"], res["problems"]


def test_stalled_rank_fails_every_survivor_within_tfring_timeout():
    """A stopped rank (alive, silent) is noticed by TFRING_TIMEOUT only.
    Every survivor must fail by then; whether each names the stopped rank
    rather than the neighbour it waited on is reported, not asserted (see
    the fault table)."""
    res = _trial("stalled rank (SIGSTOP)", 7)
    assert not res["hang"], res["problems"]
    hard = [p for p in res["problems"] if "names no failed" not in p]
    assert not hard, hard
    if res["problems"]:
        warnings.warn(f"stalled rank: {res['problems']}")
