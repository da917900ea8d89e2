"""The process-set worker's failure checks: the fault and isolation modes
(process_sets.py)."""

import os
import signal
import time

import numpy as np

from process_sets_common import check, expect_error, inputs, n, rank, results

import tfring
from tfring import _core


def run_fault():
    """Rank 3 dies while rank 2 waits for it on set [2, 3] and ranks 0 and 1
    wait for it on the world: every survivor's error names rank 3."""
    b = tfring.add_process_set([2, 3])
    if b.included():
        _core.allreduce(np.ones(4), name="warm", process_set=b.process_set_id)
    _core.allreduce(np.ones(4), name="warm")
    t0 = time.monotonic()
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        if rank == 2:
            _core.allreduce(np.ones(1000), name="f", process_set=b.process_set_id)
        else:
            _core.allreduce(np.ones(10), name="w")
        results["fault"] = {"ok": False, "error": "no error"}
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        results["fault"] = {"ok": True, "msg": str(e), "type": type(e).__name__,
                            "seconds": time.monotonic() - t0}


def run_isolation():
    """Set a = [2, 3] and set c = [0, 1, 3] (overlapping at rank 3, whose
    place in c is 2). Statistics are per set; a mismatch inside c names
    global ranks; a failure of a (rank 3 reports one) fails a on both its
    members, naming rank 3, while the world and c still reduce correctly."""
    a = tfring.add_process_set([2, 3])
    c = tfring.add_process_set([0, 1, 3])

    def reduce_on(ps, salt, count):
        ranks = ps.ranks if ps is not None else list(range(n))
        xs = inputs(salt, ranks, (count,))
        kw = {} if ps is None else {"process_set": ps.process_set_id}
        y = _core.allreduce(xs[rank], name=f"iso.{salt}", **kw)
        want = np.sum([xs[r] for r in ranks], axis=0, dtype=np.float64)
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)

    @check("stats_per_set")
    def _():
        world_before = sum(_core.allreduce_algorithm_counts().values())
        reduce_on(None, 1, 1000)
        if rank in a.ranks:
            for i in range(3):
                reduce_on(a, 10 + i, 64)
        if rank in c.ranks:
            reduce_on(c, 20, 300)
        out = {"world": _core.last_collective_stats(),
               "world_calls": sum(_core.allreduce_algorithm_counts().values()) - world_before,
               "world_vote": _core.last_vote_stats()}
        for name, ps in (("a", a), ("c", c)):
            if rank in ps.ranks:
                out[name] = _core.last_collective_stats(process_set=ps.process_set_id)
                out[name + "_calls"] = sum(_core.allreduce_algorithm_counts(
                    process_set=ps.process_set_id).values())
                out[name + "_vote"] = _core.last_vote_stats(process_set=ps.process_set_id)
            else:
                out[name + "_refused"] = expect_error(
                    lambda: _core.last_collective_stats(process_set=ps.process_set_id),
                    f"rank {rank} is not in the set")
        return out

    @check("mismatch_names_global_ranks")
    def _():
        if rank not in c.ranks:
            return {}
        shape = (3,) if rank == 3 else (4,)
        return {"msg": expect_error(
            lambda: _core.allreduce(np.ones(shape), name="iso.mm",
                                    process_set=c.process_set_id),
            "process set 2 (ranks [0, 1, 3])", "shape [4] on rank 0 vs [3] on rank 3",
            "(ranks disagreeing with rank 0: 3)")}

    @check("set_failure_is_its_own")
    def _():
        out = {}
        if rank in a.ranks:
            if rank == 3:
                _core._fail_communicator(a.process_set_id, "injected failure of set a")
            # Every member's next call on a fails, naming the rank that failed.
            out["msg"] = expect_error(
                lambda: _core.allreduce(np.ones(5), name="iso.after",
                                        process_set=a.process_set_id),
                "injected failure of set a")
        # The world and c (which shares rank 3 with a) still work.
        for i in range(3):
            reduce_on(None, 30 + i, 257)
            if rank in c.ranks:
                reduce_on(c, 40 + i, 129)
        return out

    # Leaves the failed set behind: shutdown tears it down with the rest.
    _core.allreduce(np.zeros(1), name="iso.end")


# Several modes separated by commas run one after the other in one launch,
