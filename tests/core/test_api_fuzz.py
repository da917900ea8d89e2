"""A bounded-time fuzzer of the public collective API (tests/workers/api_fuzz.py).

Random operations (allreduce, allgather, broadcast, reducescatter,
alltoall, grouped_allreduce) through the TF ops and the numpy `_core`, with
random dtypes, shapes (empty ones included), roots, splits, names (fresh,
reused, none) and process sets; about a third of the calls plant a fault
on one rank or on all (a root out of range, a scalar, bad splits, a bool to
reduce, a shape or dtype that differs from the other ranks'). Every call
must either return the numpy reference on every rank or raise on every
rank, naming the tensor, within seconds; never hang, never a wrong result.

Knobs (environment variables):
    TFRING_FUZZ_SECONDS  how long the ranks fuzz (default 10, 60 with
                         TFRING_TEST_SLOW=1)
    TFRING_FUZZ_SEED     the plan's seed, shared by the ranks (default: a
                         fixed one per rank count; printed on failure)
    TFRING_FUZZ_RANKS    comma-separated rank counts (default "3"; "2,3"
                         with TFRING_TEST_SLOW=1)

A longer run, e.g. ten minutes on 3 ranks with a new seed:
    TFRING_FUZZ_SECONDS=600 TFRING_FUZZ_RANKS=3 TFRING_FUZZ_SEED=$RANDOM \\
        python -m pytest -q tests/core/test_api_fuzz.py
"""

import os

import pytest

from multiproc import check_ok, run_ranks

_SLOW = os.environ.get("TFRING_TEST_SLOW", "") not in ("", "0")
SECONDS = float(os.environ.get("TFRING_FUZZ_SECONDS", "60" if _SLOW else "10"))
RANKS = [int(n) for n in os.environ.get("TFRING_FUZZ_RANKS", "2,3" if _SLOW else "3").split(",")]


@pytest.mark.parametrize("n", RANKS)
def test_api_fuzz(n):
    seed = int(os.environ.get("TFRING_FUZZ_SEED", str(1000 + n)))
    env = {"TFRING_FUZZ_SEED": seed, "TFRING_FUZZ_SECONDS": SECONDS,
           # A planted fault must fail fast; a timeout would mean a hang.
           "TFRING_TIMEOUT": 30}
    outs = check_ok(run_ranks(n, "api_fuzz.py", env=env, timeout=SECONDS + 240))
    failures = [f"rank {r}: {f}" for r, o in enumerate(outs) for f in o["failures"]]
    assert not failures, f"seed {seed}:\n" + "\n".join(failures[:30])
    # The plan is the same on every rank, so the ranks stopped together.
    assert len({o["iterations"] for o in outs}) == 1, outs
    assert outs[0]["calls"] > 20 and outs[0]["faults"] > 3, outs[0]
