"""Runtime plumbing: the timeline, tunables read back, lifecycle, a job of
one without any launcher."""

import os
import subprocess
import sys

import pytest

from multiproc import check_ok, run_ranks


def test_timeline_is_valid_chrome_trace(tmp_path):
    path = str(tmp_path / "timeline.{rank}.json")
    res = check_ok(run_ranks(2, "misc.py", env={"TFRING_TIMELINE": path}))
    for out in res:
        events = out["timeline"]
        names = {e.get("name") for e in events}
        assert {"NEGOTIATE", "allreduce", "allgather"} <= names, names
        threads = {e["args"]["name"] for e in events if e.get("ph") == "M"}
        assert {"grad.0", "grad.3", "gathered"} <= threads
        begins = sum(e["ph"] == "B" for e in events)
        ends = sum(e["ph"] == "E" for e in events)
        assert begins == ends > 0
        # Fusion: the four small gradients went through fusion buffers.
        assert "MEMCPY_IN_FUSION_BUFFER" in names or "allreduce" in names


def test_config_read_back_and_use_after_shutdown():
    res = check_ok(run_ranks(2, "misc.py", env={
        "TFRING_FUSION_THRESHOLD": "2MiB", "TFRING_CYCLE_TIME": "3.5",
        "TFRING_CHUNK_SIZE": "64K", "TFRING_TIMEOUT": "42", "TFRING_CACHE": "0"}))
    for out in res:
        c = out["config"]
        assert c["fusion_threshold"] == 2 << 20
        assert c["cycle_time_ms"] == 3.5
        assert c["chunk_bytes"] == 64 << 10
        assert c["timeout_s"] == 42
        assert c["cache_enabled"] is False
        assert "not initialized" in out["after_shutdown"]


def _run_alone(code):
    """Runs `code` in one fresh Python process with no launcher's variables
    (a job of one); it must print 'ok' and exit 0 within 60 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFRING_", "OMPI_", "PMI_",
                                                                     "SLURM_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_single_process_without_launcher():
    code = (
        "import numpy as np, tfring.basics as b; from tfring import _core\n"
        "b.init(); assert (b.rank(), b.size(), b.local_size()) == (0, 1, 1)\n"
        "x = np.arange(5.0)\n"
        "assert np.array_equal(_core.allreduce(x, op='average'), x)\n"
        "assert np.array_equal(_core.allgather(x), x)\n"
        "b.shutdown(); b.init(); assert b.is_initialized(); print('ok')\n")
    _run_alone(code)


def test_reducescatter_shape_rule():
    from tfring import _core
    shapes = [_core.reducescatter_shape([10, 3], r, 4) for r in range(4)]
    assert [s[0] for s in shapes] == [3, 3, 2, 2] and all(s[1] == 3 for s in shapes)
    assert sum(s[0] for s in shapes) == 10


def test_job_of_one_runs_inline_and_checks_its_input():
    # A job of one never negotiates: every collective completes before the
    # call returns, with the same results and the same errors as a ring.
    code = (
        "import numpy as np, tfring.basics as b; from tfring import _core\n"
        "b.init()\n"
        "x = np.random.default_rng(0).uniform(-1, 1, (6, 3))\n"
        "assert np.allclose(_core.allreduce(x, op='average', prescale=2.0, postscale=0.5), x)\n"
        "assert np.array_equal(_core.allreduce(x, op='max'), x)\n"
        "h = _core.allreduce_async(x.astype(np.float32), name='a'); assert h.poll()\n"
        "assert np.array_equal(h.wait(), x.astype(np.float32))\n"
        "assert np.array_equal(_core.allgather(x), x)\n"
        "assert np.array_equal(_core.broadcast(x, root=0), x)\n"
        "assert np.allclose(_core.reducescatter(x, op='sum', postscale=3.0), 3 * x)\n"
        "y = np.zeros_like(x); _core.allreduce(x, out=y); assert np.array_equal(x, y)\n"
        "for call, needle in [(lambda: _core.allgather(np.float32(1.0)), 'scalars'),\n"
        "                     (lambda: _core.broadcast(x, root=1), 'root rank 1'),\n"
        "                     (lambda: _core.reducescatter(np.float64(2.0)), 'scalars')]:\n"
        "    try:\n"
        "        call(); raise SystemExit('no error')\n"
        "    except Exception as e:\n"
        "        assert needle in str(e) and type(e).__name__ == 'InvalidArgumentError', e\n"
        "b.shutdown(); print('ok')\n")
    _run_alone(code)


def test_collective_arguments_bind_like_python():
    # The collectives parse their arguments by hand (runtime_binding.cc):
    # positional and keyword forms give the same results as numpy, and a
    # bad call raises TypeError naming the function and the argument.
    code = (
        "import numpy as np, tfring.basics as b; from tfring import _core\n"
        "b.init()\n"
        "x = np.arange(6, dtype=np.float32).reshape(2, 3)\n"
        "want = x * 2.0 * 3.0\n"
        "for got in (_core.allreduce(x, 'sum', 'p', 0, 2.0, 3.0),\n"
        "            _core.allreduce(x, postscale=3, prescale=2, name='k', op='sum'),\n"
        "            _core.allreduce(x, 'sum', None, 0, 2, postscale=3.0, process_set=0),\n"
        "            _core.allreduce_async(array=x, prescale=2.0, postscale=3.0).wait()):\n"
        "    assert np.array_equal(got, want), got\n"
        "out = np.zeros_like(x); r = _core.allreduce(x, out=out)\n"
        "assert r is out and np.array_equal(out, x)\n"
        "assert np.array_equal(_core.broadcast(x, root=0, name='bc'), x)\n"
        "assert np.array_equal(_core.allgather(x, dtype='float32'), x)\n"
        "bad = [(lambda: _core.allreduce(x, op=3), \"allreduce(): argument 'op' must be str\"),\n"
        "       (lambda: _core.broadcast(x, root=0.5), \"broadcast(): argument 'root' must be int\"),\n"
        "       (lambda: _core.allgather_async(x, bogus=1),\n"
        "        \"allgather_async() got an unexpected keyword argument 'bogus'\"),\n"
        "       (lambda: _core.reducescatter(x, 'sum', op='sum'),\n"
        "        \"reducescatter() got multiple values for argument 'op'\"),\n"
        "       (lambda: _core.allreduce(), \"allreduce() missing required argument 'array'\"),\n"
        "       (lambda: _core.allreduce(x, 'sum', None, 0, 1.0, 1.0, None, None, 0, None, 9),\n"
        "        'allreduce() takes at most 10 positional arguments (11 given)'),\n"
        "       (lambda: _core.allreduce(x, prescale='2'),\n"
        "        \"allreduce(): argument 'prescale' must be float, not str\")]\n"
        "for call, needle in bad:\n"
        "    try:\n"
        "        call(); raise SystemExit('no error: ' + needle)\n"
        "    except TypeError as e:\n"
        "        assert needle in str(e), (needle, str(e))\n"
        "assert 'allreduce(array, op=' in _core.allreduce.__doc__\n"
        "b.shutdown(); print('ok')\n")
    _run_alone(code)


# Ring vote on one host; recursive doubling forced; the host vote across
# two simulated hosts of two ranks.
@pytest.mark.parametrize("n,env,hosts", [
    (3, {}, 0),
    (4, {"TFRING_VOTE_ALGO": "recdbl"}, 0),
    (4, {"TFRING_VOTE_ALGO": "host"}, 2),
])
def test_collectives_no_caller_drives_are_served(n, env, hosts):
    per_rank = (lambda r: {"TFRING_HOSTNAME": f"host{r // hosts}"}) if hosts else None
    res = check_ok(run_ranks(n, "engine_wake.py", env=env, per_rank_env=per_rank))
    for r, out in enumerate(res):
        assert out["warm_ok"] and out["bg_ok"] and out["late_ok"] and out["turns_ok"], (r, out)
    # Rank 0 never waited on its async collective: the engine thread ran it
    # while rank 0 slept, though blocking calls had left that thread asleep.
    assert res[0]["bg_done_without_wait_s"] is not None, res[0]
