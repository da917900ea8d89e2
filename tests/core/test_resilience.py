"""Nothing is lost: a killed Keras job resumes from rank 0's checkpoint and
ends where an uninterrupted one does; many collectives and init/shutdown
cycles leak no memory, file descriptors or shared-memory segments.

Keras: 2 ranks under tfring-run train a small model (Adam, dropout) for 4
epochs of 6 steps with ResumableCheckpointCallback. The reference runs
uninterrupted. A second run has rank 1 SIGKILL itself at batch 3 of epoch 2
(0-based; rank 0 has written the checkpoint after epoch 2 by then, since
rank 1's step needs rank 0's); the launcher must exit 137 naming rank 1,
and a restart must resume at epoch 2 and end with the reference's
variables bit for bit (same data order, thread settings and ring, so the
same floating-point operations in the same order).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tf_util import RANK_ENV, tf_available

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
REPO = os.path.dirname(TESTS)
WORKERS = os.path.join(TESTS, "workers")
sys.path.insert(0, TESTS)

EPOCHS = 4
KILL_AT = "1:2:3"  # rank 1, epoch 2, batch 3
LAUNCH_TIMEOUT = 120

# RSS may grow this much over the 10,000 calls after the warm-up (allocator
# caches settling; about 1 MiB measured). A leak of 1 KiB per call would
# show as 10 MiB on top.
RSS_GROWTH_KIB = 16 * 1024

needs_keras = pytest.mark.skipif(
    not tf_available("keras"),
    reason="TensorFlow, Keras or tfring's op library (_tfring_ops.so) missing")


def launch(args, env=None, timeout=LAUNCH_TIMEOUT):
    """python -m tfring.run ARGS, with a clean TFRING_* environment."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
    e["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tfring.run", *args], cwd=REPO, env=e,
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout)


def shm_segments():
    from conftest import tfring_segments

    return tfring_segments()


# ------------------------------------------------------------ keras ----


def fit(ckpt, out, extra_args=(), env=None):
    env = dict(RANK_ENV, **(env or {}))
    return launch([*extra_args, "-np", "2", sys.executable,
                   os.path.join(WORKERS, "keras_resume.py"), str(ckpt),
                   str(out), str(EPOCHS)], env=env)


def ok(r):
    assert r.returncode == 0, (
        f"tfring-run exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\n"
        f"stderr:\n{r.stderr[-5000:]}")


def final_state(out):
    ranks = []
    for rank in range(2):
        with np.load(os.path.join(out, f"rank{rank}.npz")) as z:
            arrays = [z[k] for k in sorted(z.files, key=lambda k: int(k.split("_")[1]))]
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            ranks.append((arrays, json.load(f)))
    return ranks


def assert_same_variables(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert np.array_equal(g, w), (
            f"variable {i} differs from the uninterrupted run by up to "
            f"{np.max(np.abs(g.astype(np.float64) - w)):.3g}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("uninterrupted")
    r = fit(base / "ckpt", base / "out")
    ok(r)
    state = final_state(base / "out")
    for _, info in state:
        assert info == {"initial_epoch": 0, "epochs_ran": list(range(EPOCHS)),
                        "iterations": EPOCHS * 6}
    assert_same_variables(state[1][0], state[0][0])
    return state[0][0]


@pytest.fixture(scope="module")
def killed(tmp_path_factory, uninterrupted):
    """Checkpoints of a run whose rank 1 was SIGKILLed in epoch 2."""
    base = tmp_path_factory.mktemp("killed")
    r = fit(base / "ckpt", base / "out", env={"RESUME_KILL_AT": KILL_AT})
    return r, base / "ckpt"


@needs_keras
def test_killed_rank_is_named_and_checkpoints_survive(killed):
    r, ckpt = killed
    assert r.returncode == 137, r.stderr[-3000:]
    assert "tfring-run: rank 1 (pid" in r.stderr
    assert "was killed by signal SIGKILL" in r.stderr
    assert sorted(os.listdir(ckpt)) == ["epoch-000001.npz", "epoch-000002.npz"]


@needs_keras
def test_restart_resumes_and_matches_uninterrupted(killed, uninterrupted, tmp_path):
    _, ckpt = killed
    mine = tmp_path / "ckpt"
    shutil.copytree(ckpt, mine)
    ok(fit(mine, tmp_path / "out"))
    state = final_state(tmp_path / "out")
    for arrays, info in state:
        assert info == {"initial_epoch": 2, "epochs_ran": [2, 3],
                        "iterations": EPOCHS * 6}
        assert_same_variables(arrays, uninterrupted)


@needs_keras
def test_unreadable_newest_checkpoint_falls_back_to_older(killed, uninterrupted,
                                                          tmp_path):
    # Only rank 0 reads checkpoints: rank 1 gets epoch and state by broadcast.
    _, ckpt = killed
    mine = tmp_path / "ckpt"
    shutil.copytree(ckpt, mine)
    with open(mine / "epoch-000002.npz", "r+b") as f:
        f.truncate(100)
    r = fit(mine, tmp_path / "out")
    ok(r)
    assert "skipping unreadable checkpoint" in r.stdout
    for arrays, info in final_state(tmp_path / "out"):
        assert info["initial_epoch"] == 1 and info["epochs_ran"] == [1, 2, 3]
        assert_same_variables(arrays, uninterrupted)


@needs_keras
def test_launcher_restarts_option_resumes(uninterrupted, tmp_path):
    # The kill happens in the first start only (TFRING_RESTART=0).
    r = fit(tmp_path / "ckpt", tmp_path / "out", extra_args=["--restarts", "2"],
            env={"RESUME_KILL_AT": KILL_AT + ":0"})
    ok(r)
    assert "was killed by signal SIGKILL" in r.stderr
    assert "tfring-run: restarting the job (restart 1 of 2)" in r.stderr
    assert "restart 2 of 2" not in r.stderr
    for arrays, info in final_state(tmp_path / "out"):
        assert info["initial_epoch"] == 2
        assert_same_variables(arrays, uninterrupted)


# --------------------------------------------------------- launcher ----


def script(tmp_path, body):
    path = tmp_path / "rank.py"
    path.write_text(body)
    return str(path)


def test_restarts_stop_at_the_first_success(tmp_path):
    # Rank 1 fails in the first two starts; every start sees a fresh store.
    # Rank 1 fails only once rank 0 has printed (a marker file), since the
    # launcher then stops rank 0 at once.
    s = script(tmp_path, (
        "import os, sys, time\n"
        "n = int(os.environ['TFRING_RESTART'])\n"
        "rank = os.environ['TFRING_RANK']\n"
        "print('start', n, os.environ['TFRING_STORE_ADDR'], flush=True)\n"
        f"mark = os.path.join({str(tmp_path)!r}, f'printed.{{n}}')\n"
        "if rank == '0':\n"
        "    open(mark, 'w').close()\n"
        "elif n < 2:\n"
        "    deadline = time.time() + 30\n"
        "    while not os.path.exists(mark) and time.time() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(3)\n"))
    r = launch(["--restarts", "5", "-np", "2", sys.executable, s])
    assert r.returncode == 0, r.stderr
    starts = [line.split()[-2:] for line in r.stdout.splitlines()
              if "start" in line]
    assert sorted(int(n) for n, _ in starts) == [0, 0, 1, 1, 2, 2]
    assert len({addr for _, addr in starts}) == 3
    assert r.stderr.count("rank 1 (pid") == 2
    assert "restart 2 of 5" in r.stderr and "restart 3 of 5" not in r.stderr


def test_restarts_exhausted_exit_with_the_rank_code(tmp_path):
    s = script(tmp_path, "import os, sys\n"
               "sys.exit(5 if os.environ['TFRING_RANK'] == '0' else 0)\n")
    r = launch(["--restarts", "1", "-np", "2", sys.executable, s])
    assert r.returncode == 5
    assert r.stderr.count("rank 0 (pid") == 2
    assert "restart 1 of 1" in r.stderr


def test_no_restart_after_timeout(tmp_path):
    s = script(tmp_path, "import time\ntime.sleep(60)\n")
    r = launch(["--restarts", "3", "--timeout", "1", "-np", "2",
                sys.executable, s])
    assert r.returncode == 124
    assert "restarting" not in r.stderr


# ----------------------------------------------------------- leaks ----


def run_leak(*args, n=2, timeout=240):
    """Each rank's report; also fails if the job left segments in /dev/shm
    (as the autouse fixture in conftest.py does after every test)."""
    import conftest
    from multiproc import check_ok, run_ranks

    before = shm_segments()
    results = check_ok(run_ranks(n, "leak.py", args, timeout=timeout))
    left = [n for n in shm_segments() - before if conftest._ours(n)]
    assert not left, f"segments left in /dev/shm: {left}"
    return results


def test_10000_collectives_keep_rss_and_fds_flat():
    # Named collectives: allreduce (sizes 1..65,536), grouped, allgather,
    # broadcast, async + poll + wait; 1,000 warm-up calls first.
    for rank, out in enumerate(run_leak("collectives", 10000, 1000)):
        assert out["transport"] == "shm"
        growth = out["end"]["rss_kib"] - out["start"]["rss_kib"]
        print(f"rank {rank}: after warm-up {out['start']}, after 10,000 "
              f"more {out['end']}: RSS +{growth} KiB")
        assert growth < RSS_GROWTH_KIB, (
            f"rank {rank}: RSS grew {growth} KiB over 10,000 collectives "
            f"({out})")
        assert out["end"]["fds"] == out["start"]["fds"], f"rank {rank}: {out}"


def test_unnamed_collectives_keep_rss_flat():
    # Unnamed calls cycle through a bounded set of names, so the negotiation
    # cache (coordinator and engines) stops growing once the set is used up
    # (the warm-up goes past it).
    for rank, out in enumerate(run_leak("unnamed", 20000, 5000)):
        growth = out["end"]["rss_kib"] - out["start"]["rss_kib"]
        print(f"rank {rank}: 20,000 unnamed allreduces: RSS +{growth} KiB")
        assert growth < 4 * 1024, (
            f"rank {rank}: RSS grew {growth} KiB over 20,000 unnamed "
            f"allreduces")


def test_100_init_shutdown_cycles_with_process_sets_stay_flat():
    # A Spark or Ray worker runs job after job in one process:
    # tfring.init() after tfring.shutdown() joins again, 100 times, with two
    # process sets added and removed and a TF step every 10th cycle, and
    # leaves no fd, thread, mapped /dev/shm segment or memory behind.
    outs = run_leak("cycles", 100, n=3, timeout=400)
    for rank, out in enumerate(outs):
        print(f"rank {rank}: before {out['before']}, after cycle 1 "
              f"{out['after_first']}, after cycle 100 {out['after_last']}")
        for key in ("fds", "threads", "shm"):
            assert out["after_last"][key] == out["after_first"][key], (
                f"rank {rank}: {key} went from {out['after_first'][key]} after "
                f"the first cycle to {out['after_last'][key]} after the last ({out})")
        assert out["after_first"]["shm"] == out["before"]["shm"], out
        assert out["after_first"]["fds"] == out["before"]["fds"], out
        growth = out["after_last"]["rss_kib"] - out["after_first"]["rss_kib"]
        assert growth < 8 * 1024, f"rank {rank}: RSS grew {growth} KiB ({out})"
        np.testing.assert_allclose(out["weights"], out["reference"], rtol=1e-5)
        assert out["weights"] == outs[0]["weights"], "ranks' weights differ"


# ------------------------------------------------- the shm fixture ----


def test_shm_fixture_tells_its_own_segments(tmp_path):
    import conftest

    # Named after a live process this test started (it inherits the
    # session's marker), after a live process without the marker (another
    # job's), and after no live process: the first and last are this
    # test's.
    child = subprocess.Popen(["sleep", "30"])
    other = subprocess.Popen(["sleep", "30"], env={
        k: v for k, v in os.environ.items() if k != conftest.MARKER})
    # /proc/<pid>/environ shows the environment a process was exec'd with:
    # wait until both children are `sleep` (not the forked Python any more)
    # and their environment is in place. exec renames the process before it
    # lays out the new stack, so for a moment `comm` already says "sleep"
    # while `environ` still reads empty.
    deadline = time.time() + 10
    for p in (child, other):
        while time.time() < deadline:
            try:
                with open(f"/proc/{p.pid}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{p.pid}/environ", "rb") as f:
                    env = f.read()
                if comm == "sleep" and b"PATH=" in env:
                    break
            except OSError:
                pass
            time.sleep(0.01)
        else:
            pytest.fail(f"child {p.pid} did not exec sleep within 10 s")
    mine, theirs, orphan = (f"tfring-{pid:x}-0-r0"
                            for pid in (child.pid, other.pid, 0x7ffffffe))
    for name in (mine, theirs, orphan):
        with open(os.path.join("/dev/shm", name), "wb") as f:
            f.write(bytes(64))  # header pid 0: only the name counts
    try:
        assert conftest._ours(mine)
        assert not conftest._ours(theirs)
        assert conftest._ours(orphan)
    finally:
        for p in (child, other):
            p.kill()
            p.wait()
        for name in (mine, theirs, orphan):
            os.unlink(os.path.join("/dev/shm", name))
