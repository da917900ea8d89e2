"""The process-set worker's numpy-level checks: the core, static and errors
modes (process_sets.py)."""

import os

import numpy as np

from process_sets_common import check, evens, expect_error, inputs, odds, rank, store

import tfring
import tfring.basics as basics
from tfring import _core
from tfring import process_sets as psm


def run_core():
    st = store()
    a = tfring.add_process_set([0, 1])
    b = tfring.add_process_set([2, 3])
    mine = a if rank in (0, 1) else b

    @check("ids_and_queries")
    def _():
        assert (a.process_set_id, b.process_set_id) == (1, 2), (a, b)
        assert tfring.global_process_set.ranks == [0, 1, 2, 3]
        assert mine.included() and mine.size() == 2 and mine.rank() == rank % 2
        other = b if mine is a else a
        assert other.included() is False and other.rank() == -1

    def run_many(ps, count, salt):
        bad = []
        for i in range(count):
            xs = inputs(salt + i, ps.ranks)
            y = _core.allreduce(xs[rank], op="sum", name=f"many.{i}",
                                process_set=ps.process_set_id)
            want = sum(xs[r] for r in ps.ranks)
            if not np.allclose(y, want, rtol=1e-12, atol=1e-12):
                bad.append(i)
        return bad

    def held_while_other_runs(held, runner, tag, count):
        """held's first rank submits its collective only once runner's ranks
        have finished `count` collectives: those could only finish while
        held's collective was pending on its other rank."""
        out = {}
        if rank in held.ranks:
            xs = inputs(7, held.ranks)
            if rank == held.ranks[1]:
                h = _core.allreduce_async(xs[rank], op="sum", name=f"held.{tag}",
                                          process_set=held.process_set_id)
                st.set(f"{tag}/submitted", b"1")
            else:
                st.get(f"{tag}/submitted", 30.0)
                st.get(f"{tag}/runner_done", 60.0)
                h = _core.allreduce_async(xs[rank], op="sum", name=f"held.{tag}",
                                          process_set=held.process_set_id)
            y = h.wait()
            assert np.allclose(y, xs[held.ranks[0]] + xs[held.ranks[1]], rtol=1e-12)
        else:
            st.get(f"{tag}/submitted", 30.0)
            bad = run_many(runner, count, 100)
            assert not bad, f"wrong results at {bad}"
            if rank == runner.ranks[0]:
                st.set(f"{tag}/runner_done", b"1")
            out["ran_while_held"] = count
        return out

    @check("b_runs_while_a_held")
    def _():
        return held_while_other_runs(a, b, "a_held", 30)

    @check("a_runs_while_b_held")
    def _():
        return held_while_other_runs(b, a, "b_held", 20)

    @check("world_pending_blocks_no_set")
    def _():
        # Ranks 0-2 submit a world allreduce; rank 3 joins it only after
        # both sets have run 10 collectives each.
        x = np.full(5, float(rank + 1))
        if rank != 3:
            h = _core.allreduce_async(x, op="sum", name="world.held")
        bad = run_many(mine, 10, 300)
        assert not bad, f"wrong results at {bad}"
        st.add("sets_done", 1)
        if rank == 3:
            st.wait(["sets_done"], 30.0)
            while int(st.get("sets_done", 30.0)) < 4:
                pass
            h = _core.allreduce_async(x, op="sum", name="world.held")
        assert np.array_equal(h.wait(), np.full(5, 10.0))

    @check("overlapping_set")
    def _():
        c = tfring.add_process_set([1, 2, 3])
        if rank not in c.ranks:
            return {}
        cid = c.process_set_id
        xs = inputs(11, c.ranks, (7, 3))
        y = _core.allreduce(xs[rank], op="average", name="ovl.ar", process_set=cid)
        assert np.allclose(y, sum(xs.values()) / 3, rtol=1e-12)
        g = _core.allgather(xs[rank][: rank], name="ovl.ag", process_set=cid)
        assert np.array_equal(g, np.concatenate([xs[r][:r] for r in c.ranks]))
        bcast = _core.broadcast(xs[rank], root=3, name="ovl.bc", process_set=cid)
        assert np.array_equal(bcast, xs[3])
        rs = _core.reducescatter(xs[rank], op="sum", name="ovl.rs", process_set=cid)
        full = sum(xs.values())
        me = c.rank()
        begin = sum(7 // 3 + (1 if q < 7 % 3 else 0) for q in range(me))
        rows = 7 // 3 + (1 if me < 7 % 3 else 0)
        assert np.allclose(rs, full[begin:begin + rows], rtol=1e-12)
        # The same name as on set a/b and the world: sets name independently.
        y2 = _core.allreduce(np.ones(2), op="sum", name="many.0", process_set=cid)
        assert np.array_equal(y2, np.full(2, 3.0))
        return {}


def run_static():
    @check("static_sets")
    def _():
        assert evens.process_set_id == 1 and odds.process_set_id == 2
        assert evens.ranks == [0, 2] and odds.ranks == [1, 3]
        mine = evens if rank % 2 == 0 else odds
        xs = inputs(21, mine.ranks, (33,))
        y = _core.allreduce(xs[rank], op="max", name="st",
                            process_set=mine.process_set_id)
        assert np.array_equal(y, np.maximum(*[xs[r] for r in mine.ranks]))
        g = _core.allgather(np.array([rank]), name="st.ag",
                            process_set=mine.process_set_id)
        assert g.tolist() == mine.ranks

    @check("dynamic_add_remove")
    def _():
        os.environ["TFRING_DYNAMIC_PROCESS_SETS"] = "1"  # accepted, not needed
        def usage():
            return (len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")))

        base, alive = None, []
        for cycle in range(5):
            ps = tfring.add_process_set([[1, 2, 3], [0, 3], [2], [0, 3], [1, 2, 3]][cycle])
            assert ps.process_set_id == 3 + cycle
            if ps.included():
                y = _core.allreduce(np.full(4, rank + cycle, dtype=np.int64), op="sum",
                                    name="dyn", process_set=ps.process_set_id)
                assert np.array_equal(y, np.full(4, sum(r + cycle for r in ps.ranks)))
                alive.append(usage())
            assert tfring.remove_process_set(ps) is True
            assert ps.process_set_id is None and ps.ranks is None
            # The world still works after a removal.
            w = _core.allreduce(np.ones(3), op="sum", name="after.remove")
            assert np.array_equal(w, np.full(3, 4.0))
            now = usage()
            if cycle == 1:
                base = now
            elif cycle > 1:  # nothing leaks from one add/remove to the next
                assert now <= base, f"(threads, fds) grew from {base} to {now}"
        assert tfring.remove_process_set(tfring.global_process_set) is False
        # What a live set costs this member, over the state after removal.
        cost = [(t - base[0], f - base[1]) for t, f in alive]
        return {"threads_fds_after_remove": base, "per_set_threads_fds": cost}

    @check("shutdown_and_reinit")
    def _():
        keep = tfring.add_process_set([0, 1])
        basics.shutdown()
        assert keep.process_set_id is None
        basics.init(process_sets=[tfring.ProcessSet([2, 3])])
        ps = psm.process_set_by_id(1)
        assert ps.ranks == [2, 3]
        if ps.included():
            y = _core.allreduce(np.ones(2), op="sum", name="re", process_set=1)
            assert np.array_equal(y, np.full(2, 2.0))


def run_errors():
    @check("repeated_ranks")
    def _():
        return {"msg": expect_error(lambda: tfring.ProcessSet([0, 1, 1]),
                                    "repeats rank(s) [1]")}

    @check("out_of_range")
    def _():
        return {"msg": expect_error(lambda: tfring.add_process_set([0, 4]),
                                    "[4]", "[0, 4)")}

    @check("ranks_disagree")
    def _():
        ranks = [0, 1] if rank == 0 else [0, 2]
        msg = expect_error(lambda: tfring.add_process_set(ranks),
                           "rank 0 is adding process set 1 (ranks [0, 1])",
                           "rank 1 is adding process set 1 (ranks [0, 2])")
        return {"msg": msg}

    a = tfring.add_process_set([0, 1])
    b = tfring.add_process_set([2, 3])

    @check("non_member_core")
    def _():
        if rank in a.ranks:
            return {}
        return {"msg": expect_error(
            lambda: _core.allreduce(np.ones(2), name="x", process_set=a.process_set_id),
            "process set 1 (ranks [0, 1])", f"rank {rank} is not in the set", "'x'")}

    @check("non_member_python")
    def _():
        # What every process_set= argument goes through (the TF wrappers'
        # own use of it is checked in the tf mode).
        ps = b if rank in a.ranks else a
        return {"msg": expect_error(lambda: psm._process_set_arg(ps),
                                    f"rank {rank} is not in process set "
                                    f"{ps.process_set_id} (ranks {ps.ranks})")}

    @check("mismatch_in_set")
    def _():
        mine = a if rank in a.ranks else b
        shape = (3,) if rank == mine.ranks[0] else (4,)
        lo, hi = mine.ranks
        return {"msg": expect_error(
            lambda: _core.allreduce(np.ones(shape), name="mm",
                                    process_set=mine.process_set_id),
            f"process set {mine.process_set_id} (ranks [{lo}, {hi}])", "tensor 'mm'",
            f"shape [3] on rank {lo} vs [4] on rank {hi}")}

    @check("broadcast_root_outside")
    def _():
        mine = a if rank in a.ranks else b
        outside = 3 if mine is a else 0
        return {"msg": expect_error(
            lambda: _core.broadcast(np.ones(2), root=outside, name="bc",
                                    process_set=mine.process_set_id),
            f"root_rank={outside} is not a member of the set")}

    @check("removed_set")
    def _():
        old_id = a.process_set_id
        tfring.remove_process_set(a)
        if rank in (0, 1):
            expect_error(lambda: _core.allreduce(np.ones(2), name="gone",
                                                 process_set=old_id),
                         "process set 1 (ranks [0, 1])", "has been removed")
        return {"msg": expect_error(lambda: psm._process_set_arg(a), "is not registered")}

    @check("unknown_set")
    def _():
        expect_error(lambda: _core.allreduce(np.ones(2), name="u", process_set=42),
                     "process set 42 does not exist")
