"""The process-set worker's TensorFlow checks: the tf and alltoall_adasum
modes (process_sets.py)."""

import numpy as np

from common import adasum_ref
from process_sets_common import check, expect_error, inputs, rank

import tfring
from tfring import _core


def run_tf():
    import tensorflow as tf

    a = tfring.add_process_set([0, 1])
    b = tfring.add_process_set([2, 3])
    c = tfring.add_process_set([1, 2, 3])
    mine = a if rank in a.ranks else b

    def ops_checks(fn_wrap, tag):
        xs = inputs(31, mine.ranks, (6, 2))
        x = tf.constant(xs[rank])
        f = fn_wrap(lambda t: (
            tfring.allreduce(t, op=tfring.Sum, process_set=mine, name="ar"),
            tfring.allgather(t[:1], process_set=mine, name="ag"),
            tfring.broadcast(t, root_rank=mine.ranks[1], process_set=mine, name="bc"),
            tfring.reducescatter(t, op=tfring.Sum, process_set=mine, name="rs"),
            tfring.grouped_allreduce([t, 2 * t], op=tfring.Average, process_set=mine,
                                     name="gar")))
        ar, ag, bc, rs, gar = f(x)
        full = sum(xs.values())
        assert np.allclose(ar.numpy(), full, rtol=1e-12), tag
        assert np.array_equal(ag.numpy(), np.concatenate([xs[r][:1] for r in mine.ranks]))
        assert np.array_equal(bc.numpy(), xs[mine.ranks[1]])
        me = mine.rank()
        assert np.allclose(rs.numpy(), full[3 * me:3 * me + 3], rtol=1e-12)
        assert np.allclose(gar[0].numpy(), full / 2, rtol=1e-12)
        assert np.allclose(gar[1].numpy(), full, rtol=1e-12)

    @check("tf_errors")
    def _():
        other = b if mine is a else a
        expect_error(lambda: tfring.allreduce(tf.ones(2), process_set=other),
                     f"rank {rank} is not in process set {other.process_set_id}")
        expect_error(lambda: tfring.broadcast(tf.ones(2), root_rank=other.ranks[0],
                                              process_set=mine),
                     f"root_rank={other.ranks[0]} is not a member of the set")
        gone = tfring.add_process_set([0, 1, 2])
        tfring.remove_process_set(gone)
        expect_error(lambda: tfring.allgather(tf.ones(2), process_set=gone),
                     "is not registered")

    @check("tf_eager")
    def _():
        ops_checks(lambda f: f, "eager")

    @check("tf_function")
    def _():
        ops_checks(lambda f: tf.function(f), "function")

    @check("tf_gradient")
    def _():
        # d/dx_r of sum(allreduce_avg(x)) over the set = 1 on every member
        # (each member's loss averaged over the set); Max routes the
        # gradient to the member holding the maximum.
        if rank not in c.ranks:
            return {}
        x = tf.Variable(tf.constant([float(rank), -float(rank)]))

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                y = tfring.allreduce(x, op=tfring.Max, process_set=c, name="mx")
                loss = tf.reduce_sum(y)
            return tape.gradient(loss, x)

        g = step().numpy()
        want = np.array([3.0 if rank == 3 else 0.0, 3.0 if rank == 1 else 0.0])
        assert np.allclose(g, want), (g, want)

    @check("tf_tape")
    def _():
        # DistributedGradientTape averages over the set only.
        xs = inputs(41, mine.ranks, (5,))
        w = tf.Variable(tf.zeros(5, tf.float64))

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * x)
            tape = tfring.DistributedGradientTape(tape, process_set=mine)
            return tape.gradient(loss, [w])[0]

        g = step(tf.constant(xs[rank])).numpy()
        assert np.allclose(g, sum(xs.values()) / 2, rtol=1e-12), g

    @check("tf_broadcast_variables")
    def _():
        v = tf.Variable(tf.fill([3], float(rank)))
        tfring.broadcast_variables([v], root_rank=mine.ranks[1], process_set=mine)
        assert np.array_equal(v.numpy(), np.full(3, float(mine.ranks[1]))), v.numpy()

    @check("tf_two_sets_concurrently")
    def _():
        # Both sets' tf.function steps in flight at once on different ranks,
        # plus the overlapping set on its members.
        @tf.function
        def step(t):
            return tfring.allreduce(t, op=tfring.Sum, process_set=mine, name="loop")

        for i in range(20):
            xs = inputs(500 + i, mine.ranks, (16,))
            y = step(tf.constant(xs[rank]))
            assert np.allclose(y.numpy(), sum(xs.values()), rtol=1e-12), i


def run_alltoall_adasum():
    """alltoall and op=Adasum on sets a = [0, 1], b = [2, 3] and the
    overlapping c = [1, 2, 3], each against numpy."""
    import tensorflow as tf

    a = tfring.add_process_set([0, 1])
    b = tfring.add_process_set([2, 3])
    c = tfring.add_process_set([1, 2, 3])
    mine = a if rank in a.ranks else b

    def splits_of(ps, salt):
        """splits[i][j]: rows the set's i-th rank sends to its j-th (zeros
        included)."""
        k = len(ps.ranks)
        return [[(salt + 2 * i + 3 * j) % 4 for j in range(k)] for i in range(k)]

    def expected(ps, salt, xs, splits):
        """The rows this rank receives: from each set rank i, in set order,
        the block of rows i sent to this rank's set index."""
        me = ps.ranks.index(rank)
        blocks = []
        for i, r in enumerate(ps.ranks):
            start = sum(splits[i][:me])
            blocks.append(xs[r][start:start + splits[i][me]])
        return np.concatenate(blocks), [splits[i][me] for i in range(len(ps.ranks))]

    def set_inputs(ps, salt):
        splits = splits_of(ps, salt)
        xs = {r: np.random.default_rng(100 * salt + r).normal(
            size=(sum(splits[i]), 3)) for i, r in enumerate(ps.ranks)}
        return splits, xs

    def alltoall_checks(ps, salt, tag):
        splits, xs = set_inputs(ps, salt)
        me = ps.ranks.index(rank)
        want, want_rs = expected(ps, salt, xs, splits)
        got, rs = _core.alltoall(xs[rank], splits[me], name=f"core.{tag}",
                                 process_set=ps.process_set_id)
        assert np.array_equal(got, want) and list(rs) == want_rs, (tag, "core")
        got, rs = tfring.alltoall(tf.constant(xs[rank]), splits=splits[me],
                                  process_set=ps, name=f"eager.{tag}")
        assert np.array_equal(got.numpy(), want), (tag, "eager")
        assert list(rs.numpy()) == want_rs, (tag, "eager splits")

        @tf.function
        def fn(x, sp):
            return tfring.alltoall(x, splits=sp, process_set=ps, name=f"fn.{tag}")

        got, rs = fn(tf.constant(xs[rank]), tf.constant(splits[me]))
        assert np.array_equal(got.numpy(), want), (tag, "tf.function")
        # Gradient: the loss weighs every received row by (this rank's set
        # index + 1), so the gradient of a sent row is its receiver's
        # index + 1; it travels back over the same set.
        x = tf.constant(xs[rank])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, _ = tfring.alltoall(x, splits=splits[me], process_set=ps,
                                   name=f"grad.{tag}")
            loss = tf.reduce_sum(y) * float(me + 1)
        g = tape.gradient(loss, x).numpy()
        want_g = np.concatenate([np.full((n, 3), j + 1.0)
                                 for j, n in enumerate(splits[me])])
        assert np.array_equal(g, want_g), (tag, "gradient")

    @check("alltoall_disjoint_sets")
    def _():
        alltoall_checks(mine, 3, "disjoint")

    @check("alltoall_overlapping_set")
    def _():
        if rank in c.ranks:
            alltoall_checks(c, 5, "overlap")

    @check("alltoall_even_split")
    def _():
        xs = {r: np.arange(8.0).reshape(4, 2) + 10 * r for r in mine.ranks}
        got = tfring.alltoall(tf.constant(xs[rank]), process_set=mine, name="even")
        me = mine.ranks.index(rank)
        want = np.concatenate([xs[r][2 * me:2 * me + 2] for r in mine.ranks])
        assert np.array_equal(got.numpy(), want)

    @check("alltoall_splits_length_names_the_set")
    def _():
        # One entry per rank of the job (4) on a set of 2.
        expect_error(lambda: tfring.alltoall(tf.ones((4, 1)), splits=[1, 1, 1, 1],
                                             process_set=mine),
                     f"process set {mine.process_set_id}", "splits has 4 entries",
                     "there are 2 ranks")
        # The same mistake in numpy, caught by the set's coordinator on every
        # member.
        expect_error(lambda: _core.alltoall(np.ones((4, 1)), [1, 1, 1, 1],
                                            name="badlen",
                                            process_set=mine.process_set_id),
                     "splits has 4 entries but there are 2 ranks")

    @check("adasum_disjoint_sets")
    def _():
        xs = inputs(41, mine.ranks, (5, 3))
        want = adasum_ref([xs[r] for r in mine.ranks])
        got = tfring.allreduce(tf.constant(xs[rank]), op=tfring.Adasum,
                               process_set=mine, name="adasum")
        assert np.allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
        ys = inputs(43, mine.ranks, (7,))
        got = tfring.grouped_allreduce(
            [tf.constant(xs[rank]), tf.constant(ys[rank])], op=tfring.Adasum,
            process_set=mine, name="gadasum")
        assert np.allclose(got[0].numpy(), want, rtol=1e-12, atol=1e-12)
        assert np.allclose(got[1].numpy(), adasum_ref([ys[r] for r in mine.ranks]),
                           rtol=1e-12, atol=1e-12)
        # Not a plain sum or average: the reference differs from both.
        total = sum(xs.values())
        assert not np.allclose(want, total) and not np.allclose(want, total / 2)

    @check("adasum_set_size_not_power_of_two")
    def _():
        if rank in c.ranks:
            expect_error(lambda: tfring.allreduce(tf.ones(3), op=tfring.Adasum,
                                                  process_set=c),
                         "power-of-two", f"process set {c.process_set_id} has 3")
