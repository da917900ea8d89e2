"""Functions as jobs: tfring.runner.run (Horovod's horovod.run) and the
pieces of tfring/run/fn_job.py that other rank starters reuse.

Every job here carries its own deadline (``timeout=``), and every test
checks how long a failure took to surface: a hang is a bug."""

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import tfring
import tfring.runner as hvd_runner
from tfring.run import fn_job

cloudpickle = pytest.importorskip("cloudpickle")
# The ranks cannot import this test module by name: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

JOB_S = 60  # deadline of any one job


def _rank():
    return int(os.environ["TFRING_RANK"])


def _results(a, scale=1.0):
    rank = _rank()
    rng = np.random.default_rng(rank)
    return {"rank": rank, "size": int(os.environ["TFRING_SIZE"]),
            "value": a * rank + scale, "array": rng.normal(size=(3, 2)) * scale}


def test_results_come_back_in_rank_order_with_args_and_kwargs():
    out = hvd_runner.run(_results, args=(7,), kwargs={"scale": 0.5}, num_proc=3, timeout=JOB_S)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert {r["size"] for r in out} == {3}
    for rank, r in enumerate(out):
        assert r["value"] == 7 * rank + 0.5
        want = np.random.default_rng(rank).normal(size=(3, 2)) * 0.5
        np.testing.assert_array_equal(r["array"], want)


def _gather():
    import tfring as hvd

    hvd.init()
    try:
        return hvd.rank(), hvd.size(), hvd.allgather_object(hvd.rank() * 10 + 1)
    finally:
        hvd.shutdown()


def test_ranks_form_a_tfring_job():
    # Horovod's spelling (np, deprecated there in favour of num_proc) works too.
    with pytest.warns(DeprecationWarning, match="np is deprecated"):
        out = hvd_runner.run(_gather, np=2, timeout=JOB_S)
    assert out == [(0, 2, [1, 11]), (1, 2, [1, 11])]


def _raise_on_rank_1():
    if _rank() == 1:
        raise ValueError("bad shard 1")
    time.sleep(30)  # the job stops this rank once rank 1 fails
    return "late"


def test_a_rank_that_raises_fails_the_call_naming_it_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(hvd_runner.RankFailedError) as info:
        hvd_runner.run(_raise_on_rank_1, num_proc=2, timeout=JOB_S)
    assert time.monotonic() - t0 < 20
    e = info.value
    assert e.rank == 1
    assert "rank 1 raised ValueError: bad shard 1" in str(e)
    assert "_raise_on_rank_1" in e.remote_traceback and "Traceback" in str(e)
    assert isinstance(e.exception, ValueError) and e.exception.args == ("bad shard 1",)


def _killed_on_rank_1():
    if _rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def test_a_killed_rank_fails_the_call_naming_it_and_the_signal():
    t0 = time.monotonic()
    with pytest.raises(hvd_runner.RankFailedError, match="rank 1 was killed by signal SIGKILL"
                       ) as info:
        hvd_runner.run(_killed_on_rank_1, num_proc=2, timeout=JOB_S)
    assert time.monotonic() - t0 < 20
    assert (info.value.rank, info.value.signal) == (1, "SIGKILL")


def test_a_start_timeout_names_the_missing_ranks(tmp_path):
    # Rank 1's interpreter never starts: the executable stalls it.
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\n[ "$TFRING_RANK" = 1 ] && sleep 60\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(hvd_runner.StartTimeoutError, match=r"rank\(s\) 1 did not start") \
            as info:
        hvd_runner.run(_results, args=(1,), num_proc=2, start_timeout=3,
                       executable=str(wrapper), timeout=JOB_S)
    assert info.value.missing == [1]
    assert time.monotonic() - t0 < 3 + 15


def test_the_whole_job_timeout():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="longer than 2 s"):
        hvd_runner.run(time.sleep, args=(60,), num_proc=2, timeout=2)
    assert time.monotonic() - t0 < 15


def test_arguments_horovod_refuses_or_tfring_cannot_honour():
    with pytest.raises(ValueError, match="hosts and hostfile"):
        hvd_runner.run(_rank, hosts="localhost:1", hostfile="h")
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        hvd_runner.run(_rank, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="use_mpi"):
        hvd_runner.run(_rank, use_mpi=True)
    with pytest.raises(NotImplementedError, match="elastic"):
        hvd_runner.run(_rank, num_proc=2, min_num_proc=1)
    with pytest.raises(ValueError, match="exceeds the 1 slots"):
        hvd_runner.run(_rank, num_proc=2, hosts="localhost:1")
    assert tfring.run_fn is hvd_runner.run


def test_pieces_other_rank_starters_reuse(tmp_path):
    """What a Spark or Ray integration does: ship the payload itself, run it
    in each rank with execute(), publish() into a store, collect() in order."""
    from tfring import _core

    store = _core.FileStore(str(tmp_path / "store"))
    payload = fn_job.serialize(lambda x, k=0: x * 2 + k, (21,), {"k": 1})
    for rank in (2, 0, 1):  # ranks finish in any order
        fn_job.publish(store, rank, fn_job.execute(payload))
    assert fn_job.collect(store, 3) == [43, 43, 43]

    def fail():
        raise KeyError("missing feature")

    store = _core.FileStore(str(tmp_path / "store2"))
    fn_job.publish(store, 0, fn_job.execute(fn_job.serialize(lambda: 5)))
    fn_job.publish(store, 1, fn_job.execute(fn_job.serialize(fail)))
    with pytest.raises(fn_job.RankFailedError, match="rank 1 raised KeyError") as info:
        fn_job.collect(store, 3)
    assert info.value.rank == 1 and isinstance(info.value.exception, KeyError)
    # Rank 2 never reported: named, with what its starter knows of its end.
    store = _core.FileStore(str(tmp_path / "store3"))
    fn_job.publish(store, 0, fn_job.execute(fn_job.serialize(lambda: 5)))
    fn_job.publish(store, 1, fn_job.execute(fn_job.serialize(lambda: 6)))
    with pytest.raises(fn_job.RankFailedError, match="rank 2 exited with code 3"):
        fn_job.collect(store, 3, deaths={2: "exited with code 3"})
    with pytest.raises(TypeError, match="cannot pickle"):
        fn_job.serialize(lambda: 1, (threading.Lock(),))


def test_a_job_driven_from_another_thread():
    # Signal handlers belong to the main thread: the job runs without them.
    out = {}
    t = threading.Thread(target=lambda: out.update(
        r=hvd_runner.run(_results, args=(2,), num_proc=2, timeout=JOB_S)))
    t.start()
    t.join(JOB_S + 10)
    assert not t.is_alive()
    assert [(r["rank"], r["value"]) for r in out["r"]] == [(0, 1.0), (1, 3.0)]
