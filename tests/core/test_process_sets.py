"""Process sets (tfring/process_sets.py, csrc/runtime/registry.cc) on 4
ranks: each checked against numpy, disjoint sets running while the other is
held, static and dynamic sets, the TF ops, and the errors on every rank.
The worker is tests/workers/process_sets.py; the modes of SHARED run in
one launch, each on a fresh join, and their tests share its results."""

import functools

from multiproc import check_ok, run_ranks

SHARED = ("core", "errors", "tf", "alltoall_adasum")


@functools.lru_cache(maxsize=None)
def _shared():
    return check_ok(run_ranks(4, "process_sets.py", args=[",".join(SHARED)], timeout=600))


def run(mode, timeout=180):
    if mode in SHARED:
        return _shared()
    results = run_ranks(4, "process_sets.py", args=[mode], timeout=timeout)
    outs = check_ok(results)
    return outs


def assert_all_ok(outs, names):
    for r, out in enumerate(outs):
        for name in names:
            assert name in out, f"rank {r} did not run {name}: {sorted(out)}"
            assert out[name]["ok"], f"rank {r} {name}:\n{out[name].get('error')}"


def test_disjoint_sets_run_concurrently_and_overlapping_set():
    outs = run("core")
    assert_all_ok(outs, ["ids_and_queries", "b_runs_while_a_held", "a_runs_while_b_held",
                         "world_pending_blocks_no_set", "overlapping_set"])
    # Set b's ranks finished 30 collectives while a's was pending, and the
    # other way round.
    assert [o["b_runs_while_a_held"].get("ran_while_held") for o in outs] == [None, None, 30, 30]
    assert [o["a_runs_while_b_held"].get("ran_while_held") for o in outs] == [20, 20, None, None]


def test_static_and_dynamic_sets():
    outs = run("static")
    assert_all_ok(outs, ["static_sets", "dynamic_add_remove", "shutdown_and_reinit"])


def test_errors_name_the_set_on_every_rank():
    outs = run("errors")
    assert_all_ok(outs, ["repeated_ranks", "out_of_range", "ranks_disagree", "non_member_core",
                         "non_member_python", "mismatch_in_set", "broadcast_root_outside",
                         "removed_set", "unknown_set"])
    # Every rank, member or not, got the mismatch and disagreement errors.
    for o in outs:
        assert "across ranks" in o["mismatch_in_set"]["msg"]
        assert "ranks disagree on a process set change" in o["ranks_disagree"]["msg"]


def test_tf_ops_on_process_sets():
    outs = run("tf", timeout=240)
    assert_all_ok(outs, ["tf_errors", "tf_eager", "tf_function", "tf_gradient", "tf_tape",
                         "tf_broadcast_variables", "tf_two_sets_concurrently"])


def test_alltoall_and_adasum_on_process_sets():
    outs = run("alltoall_adasum", timeout=240)
    assert_all_ok(outs, ["alltoall_disjoint_sets", "alltoall_overlapping_set",
                         "alltoall_even_split", "alltoall_splits_length_names_the_set",
                         "adasum_disjoint_sets", "adasum_set_size_not_power_of_two"])


def test_a_member_dying_fails_every_rank_naming_it():
    results = run_ranks(4, "process_sets.py", args=["fault"], timeout=120)
    assert results[3].returncode != 0
    for r in results[:3]:
        assert r.returncode == 0, r.stderr[-3000:]
        out = r.result["fault"]
        assert out["ok"], out
        assert out["type"] == "PeerFailureError", out
        # Rank 3 is named as the job's rank, not its index in the set.
        assert "rank 3" in out["msg"] and "rank 1:" not in out["msg"], out["msg"]
        assert out["seconds"] < 30, out  # detected, not waited out (TFRING_TIMEOUT=60)


def test_sets_keep_their_own_failure_state_statistics_and_rank_names():
    outs = run("isolation", timeout=180)
    assert_all_ok(outs, ["stats_per_set", "mismatch_names_global_ranks",
                         "set_failure_is_its_own"])
    st = [o["stats_per_set"] for o in outs]
    for r, s in enumerate(st):
        # The world's last collective was its own 4-rank allreduce of 1000
        # float64, whatever the sets ran after it.
        assert s["world"]["ranks"] == 4 and s["world"]["bytes"] == 8000, (r, s)
        assert s["world_calls"] == 1, (r, s)
        assert s["world_vote"]["ranks"] == 4, (r, s)
    for r in (2, 3):  # set a = [2, 3]: three allreduces of 64 float64
        assert st[r]["a"]["ranks"] == 2 and st[r]["a"]["bytes"] == 512, st[r]
        # The first runs an algorithm; later ones may ride the vote instead.
        assert 1 <= st[r]["a_calls"] <= 3 and st[r]["a_vote"]["ranks"] == 2, st[r]
    for r in (0, 1, 3):  # set c = [0, 1, 3]: one allreduce of 300 float64
        assert st[r]["c"]["ranks"] == 3 and st[r]["c"]["bytes"] == 2400, st[r]
        assert st[r]["c_calls"] == 1 and st[r]["c_vote"]["ranks"] == 3, st[r]
    for r in (0, 1):
        assert "a_refused" in st[r], st[r]
    assert "c_refused" in st[2], st[2]
    # Set a failed on both members, naming rank 3 by its global rank (its
    # place in a is 1); the world and set c reduced correctly after it.
    for r in (2, 3):
        msg = outs[r]["set_failure_is_its_own"]["msg"]
        assert "process set 1 (ranks [2, 3])" in msg, msg
        if r == 2:
            assert "rank 3" in msg and "rank 1" not in msg, msg
