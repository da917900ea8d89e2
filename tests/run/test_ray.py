"""tfring on Ray (tfring/ray/): RayExecutor's ranks, layout, failures and
restarts, and the Ray Train backend, on a Ray cluster this module starts: two
simulated nodes (ray.cluster_utils.Cluster) of 2 CPUs each on this machine.

The ranks compute with tfring._core's numpy collectives (no TensorFlow in
the actors, which keeps the module fast), except the Ray Train test, which
trains a small Keras model."""

import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="tfring.ray needs ray (pip install 'ray[train]')")

from ray import cloudpickle  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tfring.ray import RayExecutor, WorkerError  # noqa: E402
from tfring.ray._layout import layout, machine_slots, order_by_node  # noqa: E402
from tfring.run import affinity  # noqa: E402

pytestmark = pytest.mark.timeout(240)

CPUS_PER_NODE = 2
TIMEOUT_S = 10  # the ranks' TFRING_TIMEOUT
FAIL_DEADLINE_S = 20  # a failed rank must fail run() within this

# The workers cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(__import__(__name__))


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    c.add_node(num_cpus=CPUS_PER_NODE)
    ray.init(address=c.address)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _settings():
    return RayExecutor.create_settings(timeout_s=TIMEOUT_S, placement_group_timeout_s=60)


def _allreduce_job(scale):
    """One join of the job: each rank contributes its own float64 vector;
    returns what the rank saw (its place, the sum) and leaves the job."""
    import numpy as np
    import ray

    import tfring
    from tfring import _core

    tfring.init()
    rank = tfring.rank()
    mine = np.random.default_rng(rank).normal(size=1000) * scale
    total = _core.allreduce(mine, op="sum", name="ray.sum")
    seen = {
        "rank": rank, "size": tfring.size(),
        "local_rank": tfring.local_rank(), "local_size": tfring.local_size(),
        "cross_rank": tfring.cross_rank(), "cross_size": tfring.cross_size(),
        "node": ray.get_runtime_context().get_node_id(), "sum": total,
    }
    tfring.shutdown()
    return seen


def _expected_sum(size, scale):
    return sum(np.random.default_rng(r).normal(size=1000) * scale for r in range(size))


def test_layout_orders_ranks_by_node():
    # Ray created the actors interleaved over nodes b, a, c.
    nodes = ["b", "a", "b", "a", "c"]
    order = order_by_node(nodes)
    assert order == [0, 2, 1, 3, 4]
    specs = layout([nodes[i] for i in order])
    assert [(s.host, s.local_rank, s.local_size) for s in specs] == [
        ("b", 0, 2), ("b", 1, 2), ("a", 0, 2), ("a", 1, 2), ("c", 0, 1)]
    # cross_rank: the node's index among the nodes having that local rank.
    assert [(s.cross_rank, s.cross_size) for s in specs] == [
        (0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]


def test_machine_slots_count_the_ranks_of_a_machine():
    # Two Ray nodes on machine m (a simulated cluster), one on machine n.
    infos = [{"machine": m} for m in ("m", "n", "m", "m")]
    assert machine_slots(infos) == [(0, 3), (0, 1), (1, 3), (2, 3)]


def test_two_hosts_two_workers_layout_results_and_two_runs(cluster):
    executor = RayExecutor(_settings(), num_hosts=2, num_workers_per_host=2)
    executor.start()
    try:
        for scale in (1.0, -3.0):  # two runs, each a fresh tfring.init()
            seen = executor.run(_allreduce_job, args=[scale])
            assert [s["rank"] for s in seen] == [0, 1, 2, 3]
            assert {s["size"] for s in seen} == {4}
            expected = _expected_sum(4, scale)
            for s in seen:
                np.testing.assert_allclose(s["sum"], expected, rtol=1e-12, atol=1e-12)
            # Two Ray nodes, ranks consecutive per node.
            nodes = [s["node"] for s in seen]
            assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
            assert [(s["local_rank"], s["local_size"]) for s in seen] == [
                (0, 2), (1, 2), (0, 2), (1, 2)]
            assert [(s["cross_rank"], s["cross_size"]) for s in seen] == [
                (0, 2), (0, 2), (1, 2), (1, 2)]
        # execute / execute_single run on the executable, in rank order.
        assert executor.execute(lambda e: e) == [None] * 4
        refs = executor.run_remote(lambda: os.environ["TFRING_RANK"])
        assert ray.get(refs) == ["0", "1", "2", "3"]
        # The two simulated nodes are one machine: its 4 ranks get a quarter
        # of its cores each, or all of them when there are fewer than 4.
        mine = sorted(os.sched_getaffinity(0))
        masks = ray.get(executor.run_remote(lambda: sorted(os.sched_getaffinity(0))))
        assert masks == [affinity.slice_for(r, 4, mine) or mine for r in range(4)]
    finally:
        executor.shutdown()


class _Counter:
    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1
        return self.value


def _fail_at_rank_1(how):
    import numpy as np

    import tfring
    from tfring import _core

    tfring.init()
    if tfring.rank() == 1:
        if how == "raise":
            raise ValueError("planted failure at rank 1")
        os._exit(3)
    # Rank 0 waits in a collective with the failed rank.
    _core.allreduce(np.ones(8), op="sum", name="ray.after_failure")
    return "rank 0 should not finish"


def test_failed_rank_fails_run_naming_it_then_a_new_start_runs(cluster):
    """A rank that raises, then one whose process exits: each fails run()
    within the deadline naming rank 1; each time the executor starts again,
    and the last start runs a job and an executable."""
    executor = RayExecutor(_settings(), num_workers=2)
    for how in ("raise", "exit"):
        executor.start()
        try:
            t0 = time.monotonic()
            with pytest.raises(WorkerError) as info:
                executor.run(_fail_at_rank_1, args=[how])
            elapsed = time.monotonic() - t0
            err = info.value
            assert err.rank == 1, str(err)
            assert "rank 1 of 2" in str(err).splitlines()[0]
            assert err.node_id and err.node_id[:16] in str(err) and str(err.pid) in str(err)
            if how == "raise":
                assert "ValueError: planted failure at rank 1" in str(err)
            else:
                assert "actor died" in str(err)
            assert elapsed < FAIL_DEADLINE_S, f"run() took {elapsed:.1f} s to fail ({how})"
            # The job is out of step now: no more calls until a new start.
            with pytest.raises(RuntimeError, match="shutdown.*start"):
                executor.run(_allreduce_job, args=[1.0])
        finally:
            executor.shutdown()
    executor.start(executable_cls=_Counter, executable_args=[10])
    try:
        seen = executor.run(_allreduce_job, kwargs={"scale": 2.0})
        assert [s["rank"] for s in seen] == [0, 1]
        for s in seen:
            np.testing.assert_allclose(s["sum"], _expected_sum(2, 2.0), rtol=1e-12)
        assert executor.execute(lambda c: c.bump()) == [11, 11]
        assert executor.execute_single(lambda c: c.bump()) == 12
        assert executor.execute(lambda c: c.value) == [12, 11]
    finally:
        executor.shutdown()


def _executor_in_trial():
    """What a Ray Tune trial does: a RayExecutor started from a task that
    runs inside a placement group."""
    executor = RayExecutor(_settings(), num_workers=2)
    executor.start()
    try:
        seen = executor.run(_allreduce_job, args=[0.5])
        return [s["rank"] for s in seen], [s["sum"] for s in seen], executor._pg.id.hex()
    finally:
        executor.shutdown()


@pytest.mark.slow
def test_uses_the_current_placement_group(cluster):
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    assert ray.get(pg.ready(), timeout=60)
    try:
        trial = ray.remote(num_cpus=0)(_executor_in_trial).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_capture_child_tasks=True))
        ranks, sums, used = ray.get(trial.remote(), timeout=120)
        assert ranks == [0, 1] and used == pg.id.hex()
        # shutdown() leaves a placement group it did not create.
        assert ray.util.placement_group_table(pg)["state"] == "CREATED"
        for total in sums:
            np.testing.assert_allclose(total, _expected_sum(2, 0.5), rtol=1e-12)
    finally:
        remove_placement_group(pg)


def test_bad_arguments(cluster):
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(_settings(), num_workers=2, num_hosts=2)
    with pytest.raises(NotImplementedError, match="min_workers"):
        RayExecutor(_settings(), min_workers=1, max_workers=2)
    with pytest.raises(RuntimeError, match="start"):
        RayExecutor(_settings(), num_workers=1).run(lambda: None)


def _train_loop(config):
    """Ray Train's function on every worker: a linear Keras model trained
    with full-batch SGD on this rank's shard; each rank starts from other
    weights, which the callback's initial broadcast replaces by rank 0's."""
    import keras
    import numpy as np
    import ray
    import ray.train

    import tfring
    import tfring.keras as tk

    tk.init()
    ctx = ray.train.get_context()
    rank = tfring.rank()
    assert (rank, tfring.size()) == (ctx.get_world_rank(), ctx.get_world_size())
    assert (tfring.local_rank(), tfring.local_size()) == (ctx.get_local_rank(),
                                                         ctx.get_local_world_size())
    assert tfring.cross_rank() == ctx.get_node_rank()
    x, y = (np.asarray(a, dtype=np.float32) for a in (config["x"], config["y"]))
    xs, ys = tk.shard(x, y)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(1)])
    model.layers[0].set_weights([np.asarray(config["w0"], np.float32) + rank,
                                 np.asarray(config["b0"], np.float32) - rank])
    model.compile(optimizer=keras.optimizers.SGD(config["lr"]), loss="mse")
    model.fit(xs, ys, batch_size=len(xs), epochs=config["epochs"], shuffle=False,
              verbose=0, callbacks=[tk.callbacks.RingAllreduceCallback()])
    w, b = model.layers[0].get_weights()
    np.save(os.path.join(config["out"], f"rank{rank}.npy"), np.concatenate([w.ravel(), b]))
    with open(os.path.join(config["out"], f"rank{rank}.node"), "w") as f:
        f.write(ray.get_runtime_context().get_node_id())


@pytest.mark.slow
def test_ray_train_backend_keras_fit(cluster, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    from tfring.ray import TfringConfig

    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 4))
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.25
    w0, b0 = rng.normal(size=(4, 1)) * 0.1, np.zeros(1)
    lr, epochs = 0.1, 5
    out = tmp_path / "weights"
    out.mkdir()
    trainer = TensorflowTrainer(
        _train_loop,
        train_loop_config={"x": x.tolist(), "y": y.tolist(), "w0": w0.tolist(),
                           "b0": b0.tolist(), "lr": lr, "epochs": epochs, "out": str(out)},
        tensorflow_config=TfringConfig(timeout_s=30),
        # One worker per Ray node: rank 0 serves the store on its node's
        # address. The two nodes share this machine's address, so Ray Train
        # counts them as one local world, and so does the backend.
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results"), name="tfring"))
    trainer.fit()
    nodes = [(out / f"rank{r}.node").read_text() for r in range(2)]
    assert nodes[0] != nodes[1]
    weights = [np.load(out / f"rank{r}.npy") for r in range(2)]
    np.testing.assert_array_equal(weights[0], weights[1])
    # Averaged equal-size shard gradients are the full batch's: plain
    # full-batch gradient descent on the MSE, in float64, from rank 0's start.
    w, b = w0.copy(), b0.copy()
    x32, y32 = x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)
    for _ in range(epochs):
        err = x32 @ w + b - y32
        w -= lr * 2 * x32.T @ err / len(x)
        b -= lr * 2 * err.mean(axis=0)
    np.testing.assert_allclose(weights[0], np.concatenate([w.ravel(), b]), rtol=1e-4, atol=1e-5)
