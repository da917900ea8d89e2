"""Every check of a call's own arguments, on every path a call can take.

A collective given a bad argument (a root out of range, a scalar to gather,
a dtype the operation cannot take, alltoall splits that are negative, too
many or do not add up) must fail the same way on every rank, naming the
tensor, within seconds (never by TFRING_TIMEOUT), whether the bad argument
is given on one rank or on all of them; and the job must keep working.

The matrix (tests/workers/validation.py loops over it inside the ranks):
checks x paths (a fresh name, a name used validly before, unnamed,
grouped, a process set, XLA) x APIs (the TF ops, the numpy `_core`) x who
is wrong (the last rank, every rank), on 3 ranks (and 2 with
TFRING_TEST_SLOW=1)."""

import re

import pytest

from multiproc import check_ok, run_ranks


# What each API raises for a wrong argument: TF's and Python's meaning.
EXPECTED = {"tf": "InvalidArgumentError", "core": "InvalidArgumentError"}


def _sentence(message):
    """The core's sentence ("broadcast of tensor 'x': ...") out of an error
    that TF may wrap with node names."""
    m = re.search(r"\w+ of tensor '[^']*'[^\n]*", message)
    return m.group(0).split(" [Op:")[0].rstrip(". ") if m else None


@pytest.fixture(scope="module", params=[pytest.param(2, marks=pytest.mark.slow), 3],
                ids=["2ranks", "3ranks"])
def cells(request):
    n = request.param
    results = check_ok(run_ranks(n, "validation.py", timeout=360))
    per_rank = [r["cells"] for r in results]
    assert all(len(c) == len(per_rank[0]) for c in per_rank)
    return n, per_rank


def test_every_cell_fails_alike_on_every_rank(cells):
    n, per_rank = cells
    failures = []
    covered = set()
    for i, cell0 in enumerate(per_rank[0]):
        key = f"{cell0['check']}/{cell0['path']}/{cell0['api']}/{cell0['who']}"
        if all(c[i]["skipped"] for c in per_rank):
            continue  # no wrong argument exists there (an even split of 1 rank)
        covered.add((cell0["check"], cell0["path"], cell0["api"]))
        sentences = set()
        for r, c in enumerate(per_rank):
            c = c[i]
            if c["skipped"]:
                continue
            if c["error"] != EXPECTED[cell0["api"]]:
                failures.append(f"{key} rank {r}: raised {c['error']}: {c['message'][:300]}")
                continue
            # Under tf.function the name gets the function's scope ("run/");
            # a grouped call's tensors are name.0, name.1, ...
            named = rf"'([\w.]*/)?{re.escape(c['name'] or '')}(\.\d+)?'"
            if c["name"] is not None and not re.search(named, c["message"]):
                failures.append(f"{key} rank {r}: the tensor is not named: {c['message'][:300]}")
            if "of tensor '" not in c["message"]:
                failures.append(f"{key} rank {r}: no tensor named: {c['message'][:300]}")
            # A wrong argument is refused before anything is sent, or by the
            # coordinator at once: never by waiting out TFRING_TIMEOUT.
            if c["elapsed"] > 10:
                failures.append(f"{key} rank {r}: took {c['elapsed']:.1f} s")
            sentences.add(_sentence(c["message"]))
        if len(sentences) > 1:
            failures.append(f"{key}: ranks differ: {sorted(map(str, sentences))}")
        for r, c in enumerate(per_rank):
            if "after" in c[i] and c[i]["after"] != n * (n + 1) / 2:
                failures.append(f"{key} rank {r}: the next allreduce gave {c[i]['after']}")
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} failures)"
    # The matrix is what the docstring says: every check on each path.
    checks = {c for c, _, _ in covered}
    assert len(checks) == 9, checks  # tests/workers/validation.py CHECKS
    assert {p for _, p, _ in covered} == {"fresh", "repeat", "unnamed", "grouped", "pset",
                                         "xla"}


def test_bad_only_on_one_rank_names_that_rank(cells):
    n, per_rank = cells
    for i, cell0 in enumerate(per_rank[0]):
        if cell0["who"] != "one" or cell0["skipped"] or cell0["members"] == 1:
            continue
        msg = cell0["message"]
        # "(on rank 2; the other ranks' calls were valid)", in world ranks.
        assert f"on rank {cell0['bad_rank']}" in msg, (cell0, msg)


def test_horovod_dtypes_for_allgather_broadcast_alltoall():
    """Horovod's allgather, broadcast and alltoall take uint8, int8, uint16,
    int16, int32, int64, float16, float32, float64 and bool: so do tfring's,
    through TF (eager and XLA) and numpy, exactly as numpy computes them."""
    res = check_ok(run_ranks(2, "hvd_dtypes.py", timeout=300))
    for r, out in enumerate(res):
        assert not out["failures"], f"rank {r}:\n" + "\n".join(out["failures"])


def test_util_has_horovods_names():
    import tensorflow as tf

    from tfring import util

    assert util._executing_eagerly()
    assert tf.function(lambda: tf.constant(util._executing_eagerly()))().numpy() == False  # noqa: E712
    calls = []
    square = util._cache(lambda x: calls.append(x) or x * x)
    assert square(3) == 9 and square(3) == 9 and calls == [3]
    assert util._make_subgraph(lambda: tf.constant(2) * 3)().numpy() == 6
    vs = [tf.Variable(1.0), [tf.Variable(2.0)]]
    refs = util.vars_to_refs(vs)
    assert {refs: 1}[refs] == 1  # hashable
    back = util.refs_to_vars(refs)
    assert back[0] is vs[0] and back[1][0] is vs[1][0]


def test_top_level_reaches_util_as_horovod_does():
    """horovod.tensorflow re-exports _executing_eagerly and has .util; code
    written against it calls hvd._executing_eagerly() and
    hvd.util._executing_eagerly() after `import tfring as hvd`."""
    import subprocess
    import sys

    code = ("import tensorflow as tf, tfring as hvd\n"
            "assert hvd._executing_eagerly() and hvd.util._executing_eagerly()\n"
            "traced = tf.function(lambda: tf.constant(hvd._executing_eagerly()))\n"
            "assert not traced().numpy()\n"
            "ns = {}\n"
            "exec('from tfring import *', ns)\n"
            "assert '_executing_eagerly' not in ns and 'allreduce' in ns\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
