"""tfring.spark: tfring jobs whose ranks are the tasks of a Spark barrier stage.

One SparkSession serves the whole module: local-cluster[2,2,512], two
executor JVMs of two task slots each on this host, as on a cluster (Spark
retries a failed task up to 4 times there, which the job must not do), and
the ranks of both executors make one host for tfring. Spark reuses its
Python workers from job to job, so every test after the first also checks
that a worker joins a new job after an old one (tfring's init/shutdown
many times in one process). Without `java` on the PATH (dev.sh test
installs Debian's Java 17 runtime where it can) the module skips, saying
why.
"""

import os
import signal
import sys
import time

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")

import tfring.spark  # noqa: E402
from tfring.spark import SparkJobError  # noqa: E402
from tfring.spark._task import placement  # noqa: E402

# The functions below run on the executors, whose Python cannot import this
# test module: ship them by value, as a user's script run as __main__ is.
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])


from spark_util import session  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    return session()


def _values(rank, n):
    return np.random.default_rng(100 + rank).standard_normal(n)


def _allreduce_fn(n):
    import numpy as np

    from tfring import _core, basics

    basics.init()
    x = _values(basics.rank(), n)
    got = np.asarray(_core.allreduce(x, name="spark.sum"))
    return {"rank": basics.rank(), "size": basics.size(), "local_rank": basics.local_rank(),
            "local_size": basics.local_size(), "cross_size": basics.cross_size(),
            "sum": got, "pid": os.getpid()}


def test_no_spark_context_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(pyspark.SparkContext, "_active_spark_context", None)
    with pytest.raises(RuntimeError, match="no active SparkContext"):
        tfring.spark.run(len, num_proc=2)


def test_placement_groups_ranks_by_host():
    # Partitions 0..5 land on hosts a, b, a, c, b, a: the ranks of a host are
    # consecutive, hosts come in the order of their lowest partition.
    got = placement([(0, "a"), (1, "b"), (2, "a"), (3, "c"), (4, "b"), (5, "a")])
    assert {p: got[p][0] for p in got} == {0: 0, 2: 1, 5: 2, 1: 3, 4: 4, 3: 5}
    # local_rank, local_size, cross_rank, cross_size as Horovod defines them.
    assert got[5][1:5] == (2, 3, 0, 1)  # only host a has a local_rank 2
    assert got[4][1:5] == (1, 2, 1, 2)  # local_rank 1 lives on a and b
    assert got[3][1:5] == (0, 1, 2, 3)


def test_results_in_rank_order_and_a_second_run(spark):
    n = 1000
    want = sum(_values(r, n) for r in range(3))  # float64 on the driver
    pids = []
    for size in (3, 2):  # two jobs in one session, on reused Python workers
        t0 = time.monotonic()
        out = tfring.spark.run(_allreduce_fn, args=(n if size == 3 else 10,),
                               num_proc=size, verbose=0)
        assert time.monotonic() - t0 < 60
        assert [r["rank"] for r in out] == list(range(size))
        for r in out:
            assert (r["size"], r["local_size"], r["cross_size"]) == (size, size, 1)
            # Two executors, one host: tfring's local ranks span both.
            assert r["local_rank"] == r["rank"]
            ref = want if size == 3 else sum(_values(k, 10) for k in range(2))
            np.testing.assert_allclose(r["sum"], ref, rtol=1e-12)
        pids.append({r["pid"] for r in out})
    assert pids[0] & pids[1], "Spark started new Python workers for the second job"


@pytest.mark.slow
def test_default_num_proc_is_default_parallelism(spark):
    out = tfring.spark.run(lambda: (_allreduce_fn(4)["size"]), verbose=0)
    assert out == [spark.sparkContext.defaultParallelism] * 4


def _raise_on(victim):
    import numpy as np

    from tfring import _core, basics

    basics.init()
    if basics.rank() == victim:
        raise ValueError(f"planted failure on rank {victim}")
    _core.allreduce(np.ones(8), name="spark.never")
    return "finished"


def test_a_raising_task_fails_the_call_naming_rank_and_task(spark):
    for victim in (1, 0, 1):  # every time, not just once
        t0 = time.monotonic()
        with pytest.raises(SparkJobError) as info:
            tfring.spark.run(_raise_on, args=(victim,), num_proc=2, verbose=0)
        took = time.monotonic() - t0
        assert took < 30, f"the failure took {took:.1f}s to reach the driver"
        e = info.value
        assert e.rank == victim and e.partition == victim and e.attempt == 0
        text = str(e)
        assert f"rank {victim} (Spark partition {victim}, attempt 0" in text
        assert f"ValueError: planted failure on rank {victim}" in text
    # The workers are fine afterwards.
    assert [r["rank"] for r in tfring.spark.run(_allreduce_fn, args=(4,), num_proc=2,
                                                verbose=0)] == [0, 1]


def _die_on(victim, how):
    import numpy as np

    from tfring import _core, basics

    basics.init()
    if basics.rank() == victim:
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    _core.allreduce(np.ones(8), name="spark.never")
    return "finished"


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_killed_task_fails_the_call_naming_rank(spark, how):
    t0 = time.monotonic()
    with pytest.raises(SparkJobError) as info:
        tfring.spark.run(_die_on, args=(1, how), num_proc=2, verbose=0)
    took = time.monotonic() - t0
    assert took < 30, f"the death took {took:.1f}s to reach the driver"
    assert info.value.rank == 1 and info.value.partition == 1
    assert "rank 1 (Spark partition 1, attempt 0" in str(info.value)
    assert "died without a result" in str(info.value)
    out = tfring.spark.run(_allreduce_fn, args=(4,), num_proc=2, verbose=0)
    assert [r["rank"] for r in out] == [0, 1]


@pytest.mark.slow
def test_more_ranks_than_slots_times_out_instead_of_hanging(spark):
    t0 = time.monotonic()
    with pytest.raises(SparkJobError, match=r"only 0 of 5 ranks joined within "
                                            r"start_timeout=4s"):
        tfring.spark.run(_allreduce_fn, args=(4,), num_proc=5, start_timeout=4, verbose=0)
    assert time.monotonic() - t0 < 40


def _talk():
    from tfring import basics

    basics.init()
    print(f"hello from {basics.rank()}")
    print("warned", file=sys.stderr)
    sys.stdout.write("50%\r100%\n")  # a progress bar's redraws, a piece each
    sys.stderr.write("no newline at the end")
    return basics.rank()


@pytest.mark.slow
def test_output_reaches_the_driver_as_horovod_writes_it(spark):
    import io
    import re

    out, err = io.StringIO(), io.StringIO()
    assert tfring.spark.run(_talk, num_proc=2, stdout=out, stderr=err, verbose=0) == [0, 1]
    # Horovod's format: no space after the colon; "\r" ends a piece too.
    assert sorted(out.getvalue().split("\n")) == sorted(
        ["", "[0]<stdout>:hello from 0", "[1]<stdout>:hello from 1",
         "[0]<stdout>:50%\r[0]<stdout>:100%", "[1]<stdout>:50%\r[1]<stdout>:100%"])
    assert sorted(err.getvalue().splitlines()) == [
        "[0]<stderr>:no newline at the end", "[0]<stderr>:warned",
        "[1]<stderr>:no newline at the end", "[1]<stderr>:warned"]
    out = io.StringIO()
    tfring.spark.run(_talk, num_proc=2, stdout=out, stderr=io.StringIO(), verbose=0,
                     prefix_output_with_timestamp=True)
    # time.asctime()'s form right before the rank, as Horovod writes it.
    stamp = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    hello = [ln for ln in out.getvalue().splitlines() if "hello" in ln]
    assert len(hello) == 2 and all(re.fullmatch(stamp + r"\[[01]\]<stdout>:hello from [01]", ln)
                                   for ln in hello), hello


def _in_own_process(fail):
    import numpy as np

    from tfring import _core, basics

    basics.init()
    print(f"python {basics.rank()}")
    os.write(2, f"fd 2 of rank {basics.rank()}\n".encode())  # below Python's streams
    if fail == basics.rank():
        raise ValueError("planted in fn's own process")
    if fail == "exit" and basics.rank() == 1:
        os._exit(3)
    got = np.asarray(_core.allreduce(np.ones(4) * (basics.rank() + 1), name="spark.exe"))
    return (basics.rank(), os.environ.get("TFRING_SPARK_VIA"), os.getpid(), got.tolist())


def _wrapper(tmp_path):
    """An executable that is not the workers' Python: a script that marks
    its processes, then starts this interpreter."""
    path = tmp_path / "python-wrapper"
    path.write_text(f"#!/bin/sh\nTFRING_SPARK_VIA=wrapper exec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_executable_runs_fn_in_a_process_of_it(spark, tmp_path):
    import io

    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    got = tfring.spark.run(_in_own_process, args=(None,), num_proc=2,
                           executable=_wrapper(tmp_path), stdout=out, stderr=err, verbose=0)
    took = time.monotonic() - t0
    assert [(r, via, s) for r, via, _, s in got] == [(0, "wrapper", [3.0] * 4),
                                                     (1, "wrapper", [3.0] * 4)]
    assert sorted(out.getvalue().splitlines()) == ["[0]<stdout>:python 0", "[1]<stdout>:python 1"]
    # What the process writes to its file descriptors reaches the driver too.
    assert "[1]<stderr>:fd 2 of rank 1" in err.getvalue().splitlines(), err.getvalue()
    assert took < 60, took


@pytest.mark.slow
def test_executable_failures_name_the_rank(spark, tmp_path):
    exe = _wrapper(tmp_path)
    with pytest.raises(SparkJobError) as info:
        tfring.spark.run(_in_own_process, args=(1,), num_proc=2, executable=exe, verbose=0)
    assert info.value.rank == 1
    assert "ValueError: planted in fn's own process" in str(info.value)
    with pytest.raises(SparkJobError) as info:
        tfring.spark.run(_in_own_process, args=("exit",), num_proc=2, executable=exe, verbose=0)
    assert info.value.rank == 1
    assert f"died without a result: fn's process ({exe}) exited with code 3" in str(info.value)
    with pytest.raises(SparkJobError, match="cannot start executable="):
        tfring.spark.run(_in_own_process, args=(None,), num_proc=2,
                         executable=str(tmp_path / "missing"), verbose=0)


def _env_probe():
    from tfring import basics

    basics.init()
    return (basics.size(), os.environ.get("TFRING_SPARK_TEST_VAR"),
            os.environ.get("TFRING_TIMEOUT"))


@pytest.mark.slow
def test_env_reaches_fn_and_is_put_back(spark, monkeypatch):
    monkeypatch.setenv("TFRING_TIMEOUT", "77")  # a driver tunable travels to the ranks
    # A launcher's variables are the task's own: an outer launcher's file
    # store or elastic id must not redirect this job's init().
    env = {"TFRING_SPARK_TEST_VAR": "x", "TFRING_FILE_STORE": "/nonexistent",
           "TFRING_ELASTIC_ID": "3"}
    assert tfring.spark.run(_env_probe, num_proc=2, env=env, verbose=0) == [(2, "x", "77")] * 2
    monkeypatch.delenv("TFRING_TIMEOUT")
    # The reused workers no longer carry the job's variables.
    for _ in range(2):
        assert tfring.spark.run(_env_probe, num_proc=4, verbose=0) == [(4, None, None)] * 4


def _cpus():
    from tfring import basics

    basics.init()
    return basics.rank(), sorted(os.sched_getaffinity(0))


def test_ranks_run_on_their_own_cores_as_under_tfring_run(spark):
    from tfring.run import affinity

    # The executors run on this machine, with the cores this process has.
    mine = sorted(os.sched_getaffinity(0))
    want = {r: affinity.slice_for(r, 2, mine) or mine for r in range(2)}
    assert dict(tfring.spark.run(_cpus, num_proc=2, verbose=0)) == want
    # TFRING_BIND=none leaves them unbound; and the reused workers got their
    # own mask back after the job above.
    got = tfring.spark.run(_cpus, num_proc=2, env={"TFRING_BIND": "none"}, verbose=0)
    assert dict(got) == {0: mine, 1: mine}


def test_run_elastic_says_what_to_use():
    with pytest.raises(NotImplementedError, match="tfring-run --min-np"):
        tfring.spark.run_elastic(_allreduce_fn, num_proc=2, min_num_proc=1, max_num_proc=3,
                                 elastic_timeout=60, reset_limit=2)
    # Horovod's deprecated spellings warn as Horovod's do, then the same refusal.
    for name in ("min_np", "max_np"):
        new = name.replace("np", "num_proc")
        with pytest.warns(DeprecationWarning, match=f"{name} is deprecated, use {new} instead"):
            with pytest.raises(NotImplementedError, match="tfring-run --min-np"):
                tfring.spark.run_elastic(_allreduce_fn, num_proc=2, **{name: 2})
    with pytest.raises(ValueError, match="use_mpi"):
        tfring.spark.run(_allreduce_fn, num_proc=2, use_mpi=True)


def _fit_on_shard(path):
    import keras
    import numpy as np
    import tensorflow as tf

    import tfring.keras as tk
    import tfring.spark as ts

    tk.init()
    ids = ts.read_shard(path, columns=["id"]).column("id").to_pylist()
    ds, steps = ts.make_dataset(path, ["x0", "x1", "x2"], "y", batch_size=8)
    keras.utils.set_random_seed(tk.rank())  # different starts: the callback aligns them
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    init = [np.asarray(w) for w in model.get_weights()]  # rank 0's is everyone's start
    hist = model.fit(ds, steps_per_epoch=steps, epochs=2, verbose=0,
                     callbacks=[tk.callbacks.RingAllreduceCallback()])
    del tf
    return {"ids": ids, "steps": steps, "loss": hist.history["loss"], "init": init,
            "weights": [np.asarray(w) for w in model.get_weights()]}


def test_shards_deal_files_in_turn_and_refuse_too_few(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i, n in enumerate((3, 0, 5, 2, 4)):  # an empty file is a file too
        start = 10 * i
        pq.write_table(pa.table({"id": pa.array(range(start, start + n), pa.int64())}),
                       tmp_path / f"part-{i:05d}.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    got = [tfring.spark.read_shard(str(tmp_path), rank=r, size=2).column("id").to_pylist()
           for r in range(2)]
    assert got == [[0, 1, 2, 20, 21, 22, 23, 24, 40, 41, 42, 43], [30, 31]]
    with pytest.raises(ValueError, match=r"holds 5 Parquet files for 6 ranks"):
        tfring.spark.shard_files(str(tmp_path), rank=0, size=6)
    with pytest.raises(FileNotFoundError, match="no Parquet files"):
        tfring.spark.read_shard(str(tmp_path / "missing"), rank=0, size=1)


def _full_batch_sgd(weights, x, y, batches, lr):
    """The 2-rank training in one process, in float64: ``batches`` lists,
    step by step, the rows of the full batch (both ranks' batches). With
    equal batches and a mean loss, the average of the ranks' gradients is
    the gradient of the mean squared error over the full batch. Returns the
    final weights and each step's loss before its update."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    losses = []
    for rows in batches:
        xb, yb = x[rows], y[rows][:, None]
        h = np.tanh(xb @ w1 + b1)
        err = h @ w2 + b2 - yb
        losses.append(float(np.mean(err ** 2)))
        d_out = 2.0 * err / len(rows)
        d_h = (d_out @ w2.T) * (1.0 - h ** 2)
        grads = (xb.T @ d_h, d_h.sum(0), h.T @ d_out, d_out.sum(0))
        w1, b1, w2, b2 = (w - lr * g for w, g in zip((w1, b1, w2, b2), grads))
    return [w1, b1, w2, b2], losses


@pytest.mark.slow
def test_dataframe_shards_train_like_one_process_on_the_full_batch(spark, tmp_path):
    rng = np.random.default_rng(7)
    rows = 96
    x = rng.standard_normal((rows, 3))
    y = x @ np.array([0.5, -1.0, 2.0]) + 0.1
    # 4 partitions of 24 rows: Spark's round-robin repartition into 4 files
    # then gives every file 24 rows, every rank 48, 6 whole batches of 8.
    data = spark.sparkContext.parallelize(
        [(i, float(x[i, 0]), float(x[i, 1]), float(x[i, 2]), float(y[i])) for i in range(rows)],
        4)
    df = spark.createDataFrame(data, ["id", "x0", "x1", "x2", "y"])
    path = str(tmp_path / "train")
    tfring.spark.write_parquet(df, path, num_files=4)
    out = tfring.spark.run(_fit_on_shard, args=(path,), num_proc=2, verbose=0)
    ids = [set(r["ids"]) for r in out]
    assert ids[0] and ids[1] and not ids[0] & ids[1], "the shards overlap"
    assert ids[0] | ids[1] == set(range(rows)), "the shards miss rows"
    assert sum(len(r["ids"]) for r in out) == rows  # and no row twice
    assert out[0]["steps"] == out[1]["steps"] == min(len(s) for s in ids) // 8
    for a, b in zip(out[0]["weights"], out[1]["weights"]):
        np.testing.assert_array_equal(a, b)

    # The reference: each step's full batch is the rows of both ranks'
    # batches (each rank reads its shard in order, 8 rows a step, and its
    # dataset starts over once the shard is used up).
    steps = out[0]["steps"]
    assert all(len(r["ids"]) == steps * 8 for r in out), [len(r["ids"]) for r in out]
    batches = [np.concatenate([r["ids"][8 * s:8 * s + 8] for r in out])
               for _ in range(2) for s in range(steps)]
    want, losses = _full_batch_sgd(out[0]["init"], x, y, batches, lr=0.05)
    for got, ref in zip(out[0]["weights"], want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # Keras's epoch loss: the mean of its steps' losses, averaged over ranks.
    np.testing.assert_allclose(out[0]["loss"], [np.mean(losses[:steps]), np.mean(losses[steps:])],
                               rtol=1e-4)
    assert losses[-1] < losses[0]  # it learned something
