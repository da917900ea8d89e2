"""tfring-run, how it ends a job: a failing rank or one killed by a signal,
ranks that ignore SIGTERM, --timeout, a rank late to init(), a command that
cannot start, and SIGINT/SIGTERM forwarded to every rank.

Every subprocess has a deadline: a hang is a failure, not a stuck CI run.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from launch_util import DEADLINE_S, REPO, WORKER, _clean_env, launch, script

WAIT_S = 30  # for what a test waits on while a job runs


def wait_for(predicate, timeout=WAIT_S, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False

# ---------------------------------------------------------------- failures --

# Rank FAIL_RANK fails (how: argv[2]) once every rank has written its pid;
# the others would sleep far past the test's deadline.
FAILING = """
    import os, signal, sys, time
    d, how = sys.argv[1], sys.argv[2]
    rank, size = int(os.environ["TFRING_RANK"]), int(os.environ["TFRING_SIZE"])
    if how == "ignore-term" and rank != 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(d, "pid%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        while len([n for n in os.listdir(d) if n.startswith("pid")]) < size:
            time.sleep(0.01)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    time.sleep(120)
"""


def _pids(tmp_path, n):
    return [int((tmp_path / f"pid{i}").read_text()) for i in range(n)]


def test_failing_rank_stops_the_job(tmp_path):
    fail = script(tmp_path, FAILING)
    t0 = time.monotonic()
    r = launch(["-np", "3", sys.executable, fail, str(tmp_path), "exit"])
    assert time.monotonic() - t0 < 15
    assert r.returncode == 3
    pids = _pids(tmp_path, 3)
    assert (
        f"tfring-run: rank 1 (pid {pids[1]}) exited with code 3; "
        "terminating the other ranks"
    ) in r.stderr
    assert not any(pid_alive(p) for p in pids)


def test_rank_killed_by_signal_is_named(tmp_path):
    fail = script(tmp_path, FAILING)
    r = launch(["-np", "2", sys.executable, fail, str(tmp_path), "kill"])
    assert r.returncode == 128 + signal.SIGKILL
    pid = _pids(tmp_path, 2)[1]
    assert f"rank 1 (pid {pid}) was killed by signal SIGKILL" in r.stderr


def test_ranks_ignoring_sigterm_get_sigkill(tmp_path):
    fail = script(tmp_path, FAILING)
    t0 = time.monotonic()
    r = launch(
        [
            "-np",
            "3",
            "--grace-period",
            "0.5",
            sys.executable,
            fail,
            str(tmp_path),
            "ignore-term",
        ]
    )
    assert time.monotonic() - t0 < 15
    assert r.returncode == 3
    assert "sending SIGKILL" in r.stderr
    assert not any(pid_alive(p) for p in _pids(tmp_path, 3))


def test_timeout_stops_the_job(tmp_path):
    sleeper = script(tmp_path, "import time\ntime.sleep(120)\n")
    t0 = time.monotonic()
    r = launch(["-np", "2", "--timeout", "1", sys.executable, sleeper])
    assert time.monotonic() - t0 < 15
    assert r.returncode == 124
    assert "timeout" in r.stderr and "--timeout" in r.stderr


def test_start_timeout_names_the_late_rank():
    out = launch(["-np", "2", "--start-timeout", "3", "--grace-period", "1",
                  sys.executable, WORKER, "late", "300"], timeout=90)
    assert out.returncode == 124, out.stdout[-2000:] + out.stderr[-3000:]
    assert "rank(s) 1 did not reach tfring.init() within 3 s" in out.stderr, out.stderr


def test_success_exits_zero_and_missing_command_fails(tmp_path):
    ok = script(tmp_path, "print('ok')\n")
    r = launch(["-np", "2", sys.executable, ok])
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["[0]<stdout>:ok", "[1]<stdout>:ok"]
    r = launch(["-np", "2", str(tmp_path / "no-such-program")])
    assert r.returncode == 127
    assert "cannot start rank 0" in r.stderr


# ----------------------------------------------------------------- signals --

@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)
def test_signals_are_forwarded_to_every_rank(tmp_path, signum):
    catcher = script(
        tmp_path,
        """
        import os, signal, sys, time
        d = sys.argv[1]
        rank = os.environ["TFRING_RANK"]
        def on_signal(signum, frame):
            with open(os.path.join(d, "got%s" % rank), "w") as f:
                f.write(signal.Signals(signum).name)
            sys.exit(0)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        open(os.path.join(d, "ready%s" % rank), "w").close()
        time.sleep(120)
    """,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfring.run",
            "-np",
            "3",
            sys.executable,
            catcher,
            str(tmp_path),
        ],
        cwd=REPO,
        env=_clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: all((tmp_path / f"ready{i}").exists() for i in range(3)),
            what="ranks to start",
        )
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum
    assert f"received {name}; forwarding it to all ranks" in err
    for i in range(3):
        assert (tmp_path / f"got{i}").read_text() == name
