"""Elastic training: tfring-run --min-np/--max-np/--host-discovery-script.

Three "hosts" are loopback addresses of this machine (127.0.0.1-3, each
with 2 slots): the driver starts their workers as local processes, and a
host fails when its ranks are SIGKILLed. The training (workers/
elastic_train.py) is linear regression on numpy and the core, whose weights
depend only on the sequence of job sizes, which the state records: a numpy
replay of that sequence is the reference.
"""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "workers")))
from elastic_train import DIM, LR, example  # noqa: E402

pytest.importorskip("tfring._core", reason="tfring._core not built")
from launch_util import _env  # noqa: E402

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORKER = os.path.join(TESTS, "workers", "elastic_train.py")
JOB_TIMEOUT = 150
THREE_HOSTS = "127.0.0.1:2\n127.0.0.2:2\n127.0.0.3:2\n"


def reference(sizes):
    """The weights after one step per entry of sizes, in float64."""
    w = np.zeros(DIM)
    for step, n in enumerate(sizes):
        grads = []
        for r in range(n):
            x, y = example(step, r, n)
            grads.append((x @ w - y) * x)
        w = w - LR * np.mean(grads, axis=0)
    return w


def elastic_run(tmp_path, hosts, options, timeout=JOB_TIMEOUT, **env):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    cmd = [sys.executable, "-m", "tfring.run", "--host-discovery-script",
           f"cat {hosts_file}", *options, sys.executable, WORKER]
    try:
        out = subprocess.run(cmd, env=_env(**{"TFRING_TIMEOUT": 30, **env}),
                             cwd=tmp_path,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"elastic job still running after {timeout} s\n"
                    f"stdout:\n{e.stdout!r}\nstderr:\n{e.stderr!r}")
    out.show = f"exit {out.returncode}\nstdout:\n{out.stdout[-5000:]}\nstderr:\n" \
               f"{out.stderr[-6000:]}"
    out.joins = [json.loads(m) for m in re.findall(r"JOIN (\{.*\})", out.stdout)]
    results = [json.loads(m) for m in re.findall(r"RESULT (\{.*\})", out.stdout)]
    out.result = results[-1] if results else None
    return out


def check_result(out):
    assert out.returncode == 0, out.show
    assert out.result is not None, out.show
    got, sizes = np.array(out.result["w"]), out.result["sizes"]
    np.testing.assert_allclose(got, reference(sizes), rtol=1e-10, atol=1e-12)
    # A different schedule gives different weights: the comparison can fail.
    assert not np.allclose(got, reference([sizes[0]] * len(sizes)))
    return sizes


@pytest.mark.parametrize("victim,order", [("127.0.0.2", [0, 1, 4, 5]),
                                          ("127.0.0.1", [2, 3, 4, 5])])  # rank 0's host
def test_host_killed_mid_training_survivors_continue(tmp_path, victim, order):
    out = elastic_run(tmp_path, THREE_HOSTS,
                      ["--min-np", "2", "--max-np", "6", "--elastic-timeout", "30"],
                      KILL_HOST=victim, KILL_STEP=11, STEPS=24, COMMIT_EVERY=2)
    sizes = check_result(out)
    # Steps 0-9 (committed after step 9) ran on 6 ranks; the survivors
    # redid step 10 onwards on 4.
    assert sizes == [6] * 10 + [4] * 14, (sizes, out.show)
    first = {j["wid"]: j for j in out.joins if j["size"] == 6}
    after = [j for j in out.joins if j["size"] == 4]
    assert len(first) == 6 and len(after) == 4, out.show
    for j in after:  # the same processes, resumed from the last commit
        assert j["pid"] == first[j["wid"]]["pid"] and j["host"] != victim, out.show
        assert j["step"] == 10, out.show
    # Rank 0 of the new membership is a survivor and the ranks keep their order.
    assert [j["wid"] for j in sorted(after, key=lambda j: j["rank"])] == order
    assert f"host {victim} blacklisted" in out.stderr, out.show
    assert "epoch 1: 4 rank(s)" in out.stderr and "killed by SIGKILL" in out.stderr, out.show


def test_host_added_by_discovery_grows_job_at_commit(tmp_path):
    grow = tmp_path / "hosts.txt"
    out = elastic_run(tmp_path, "127.0.0.1:2\n", ["--min-np", "2", "--max-np", "6"],
                      STEPS=10, GROW_FILE=grow, GROW_STEP=4,
                      GROW_LINES="127.0.0.1:2,127.0.0.2:2", GROW_SIZE=4, STEP_SLEEP=0.05)
    sizes = check_result(out)
    # The new workers may become ready one at a time (2 -> 3 -> 4).
    assert sizes[0] == 2 and sizes[-1] == 4 and sizes == sorted(sizes), sizes
    changes = [i for i in range(1, len(sizes)) if sizes[i] != sizes[i - 1]]
    assert all(i % 2 == 0 for i in changes), f"the job grew between commits: {sizes}"
    new = [j for j in out.joins if j["host"] == "127.0.0.2"]
    assert {j["wid"] for j in new} == {2, 3} and new, out.show
    for j in new:
        # A new rank joins where the others are (the committed state was
        # broadcast to it), not at step 0.
        assert j["step"] in changes and sizes[j["step"]] == j["size"], (j, sizes)
    survivors = {j["pid"] for j in out.joins if j["host"] == "127.0.0.1"}
    assert len(survivors) == 2, out.show  # grown without restarting anyone
    assert "host 127.0.0.2 added" in out.stderr, out.show


def test_min_np_not_met_fails_after_timeout_naming_the_host(tmp_path):
    out = elastic_run(tmp_path, "127.0.0.1:1\n127.0.0.2:1\n",
                      ["--min-np", "2", "--elastic-timeout", "3"],
                      KILL_HOST="127.0.0.2", KILL_STEP=3, STEPS=1000)
    assert out.returncode == 1, out.show
    assert re.search(r"only 1 of --min-np 2 workers available after 3 s", out.stderr), out.show
    assert "127.0.0.2: blacklisted" in out.stderr, out.show
    # The surviving worker learns why and leaves: no hang, a clear error.
    assert "the job was stopped" in out.stderr, out.show


@pytest.mark.parametrize("bad,message", [
    ("echo 'not a host line!'", "printed 'not a host line!' on line 1"),
    ("echo oops >&2; exit 3", "exited with code 3: oops"),
    ("sleep 30", "did not finish within 2 s"),
])
def test_discovery_script_errors_keep_current_hosts(tmp_path, bad, message):
    flag = tmp_path / "flag"
    script = tmp_path / "discover.sh"
    script.write_text(f"if [ -e {flag} ]; then {bad}; else echo 127.0.0.1:2; fi\n")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("")
    cmd_opts = ["--min-np", "2", "--max-np", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "tfring.run", "--host-discovery-script", f"sh {script}",
         *cmd_opts, sys.executable, WORKER],
        env=_env(TFRING_TIMEOUT=30, TFRING_DISCOVERY_TIMEOUT=2, STEPS=40, FLAG_FILE=flag,
                 FLAG_STEP=2, STEP_SLEEP=0.15),
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=JOB_TIMEOUT)
    out.show = f"exit {out.returncode}\nstderr:\n{out.stderr[-5000:]}"
    assert out.returncode == 0, out.show
    assert message in out.stderr and "keeping the current hosts" in out.stderr, out.show
    result = json.loads(re.findall(r"RESULT (\{.*\})", out.stdout)[-1])
    assert result["sizes"] == [2] * 40
    np.testing.assert_allclose(result["w"], reference(result["sizes"]), rtol=1e-10)


def test_discovery_output_parsing():
    from tfring.run.discovery import DiscoveryError, parse_output

    assert parse_output("a:2\n\n# c\nb\n", 3) == {"a": 2, "b": 3}
    for text, why in (("a:x\n", "expected 'host:slots'"), ("a b:2\n", "expected"),
                      ("a:0\n", "slots must be >= 1"), ("a\n", "--slots-per-host")):
        with pytest.raises(DiscoveryError, match=why):
            parse_output(text, None)


def test_elastic_options_need_elastic_mode():
    out = subprocess.run([sys.executable, "-m", "tfring.run", "-np", "2",
                          "--elastic-timeout", "3", "true"], env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "only in elastic mode" in out.stderr, out.stderr


def run_and_kill_host(tmp_path, script, trigger, victim, hosts, timeout=240):
    """Runs an example under the elastic driver; when a line matches trigger,
    SIGKILLs every worker the driver started on host victim. Returns
    (exit code, output, killed pids)."""
    import signal
    import threading

    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    cmd = [sys.executable, "-m", "tfring.run", "--min-np", "2", "--max-np", "6",
           "--elastic-timeout", "60", "--host-discovery-script", f"cat {hosts_file}",
           sys.executable, os.path.join(os.path.dirname(TESTS), "examples", script)]
    proc = subprocess.Popen(cmd, env=_env(TFRING_TIMEOUT=30), cwd=tmp_path, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    lines, killed = [], []
    start = time.monotonic()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if not killed and re.search(trigger, line):
                text = "".join(lines)
                pids = [int(p) for p in
                        re.findall(rf"started worker \d+ \(pid (\d+)\) on {re.escape(victim)}\n",
                                   text)]
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                killed = pids or [None]
        proc.wait()
    finally:
        timer.cancel()
    out = "".join(lines)
    assert time.monotonic() - start < timeout, f"still running after {timeout} s:\n{out[-5000:]}"
    return proc.returncode, out, killed


@pytest.mark.parametrize("script,trigger,done", [
    # The custom-loop example under the slow flag: the Keras one runs the
    # same elastic machinery (State, commit, reset) through model.fit.
    pytest.param("elastic_tf2.py", r"Step #20\b", r"ELASTIC_DONE size=2 batch=200 ",
                 marks=pytest.mark.slow),
    ("elastic_keras.py", r"Epoch 2/", r"ELASTIC_DONE size=2 epoch=6"),
])
def test_horovod_style_examples_survive_a_host_failure(tmp_path, script, trigger, done):
    pytest.importorskip("tensorflow")
    # The examples differ from Horovod's only in the import line.
    text = open(os.path.join(os.path.dirname(TESTS), "examples", script)).read()
    assert re.search(r"^import tfring(\.keras)? as hvd$", text, re.M)
    assert "horovod" not in text.replace("Horovod", "")
    code, out, killed = run_and_kill_host(tmp_path, script, trigger, "127.0.0.2",
                                          "127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n")
    assert code == 0 and killed and killed[0], out[-6000:]
    assert re.search(done, out), out[-6000:]
    assert re.search(r"epoch 1: 2 rank\(s\) \[0:w0@127.0.0.1 1:w2@127.0.0.3\]", out), out[-6000:]
    # The survivors were not restarted: no worker beyond the first three.
    assert "started worker 3" not in out, out[-6000:]


def test_failing_host_blacklisted_then_readmitted_without_leaks(tmp_path):
    # Workers 2 and 3 (both on 127.0.0.2) die 4 steps after joining: the
    # host is blacklisted for 1 s, then 2 s, and its third worker stays.
    out = elastic_run(tmp_path, "127.0.0.1:2\n127.0.0.2:1\n",
                      ["--min-np", "2", "--max-np", "3", "--blacklist-cooldown-range", "1", "4",
                       "--elastic-timeout", "30"],
                      KILL_WIDS="2,3", UNTIL_WID=4, STEPS=10, STEP_SLEEP=0.03)
    sizes = check_result(out)
    assert "host 127.0.0.2 blacklisted for 1 s (1 failure(s))" in out.stderr, out.show
    assert "host 127.0.0.2 blacklisted for 2 s (2 failure(s))" in out.stderr, out.show
    assert out.stderr.count("host 127.0.0.2 readmitted after its blacklist cool-down") == 2
    assert {j["wid"] for j in out.joins if j["host"] == "127.0.0.2"} == {2, 3, 4}, out.show
    assert 2 in sizes and 3 in sizes, sizes
    # The survivors went through 4 re-formations in the same processes and
    # hold no more fds, threads or shared-memory segments at a size-3
    # membership than at the first one.
    for wid in (0, 1):
        mine = [j for j in out.joins if j["wid"] == wid]
        assert len({j["pid"] for j in mine}) == 1 and len(mine) >= 5, out.show
        at3 = [j for j in mine if j["size"] == 3]
        assert len(at3) >= 3, out.show
        for key in ("fds", "threads", "shm"):
            assert {j[key] for j in at3} == {at3[0][key]}, (key, at3)


def test_state_sync_restore_and_mismatch_error():
    from multiproc import check_ok, run_ranks

    outs = check_ok(run_ranks(3, "elastic_state.py", timeout=90))
    for r, out in enumerate(outs):
        assert out["synced"] == [0, [0.0, 0.0, 0.0]], out
        assert out["restored"] == 1, out
        # Every rank raises (none is left waiting in a broadcast), naming rank 1.
        msg = out["mismatch"]
        assert "rank(s) 1's state differs from rank 0's" in msg, msg
        assert ("dense/bias: ((8,), 'float32') here, ((7,), 'float32') on rank 0" in msg) \
            == (r == 1), msg
        assert "dense/kernel" not in msg, msg


def test_twenty_host_failures_in_a_row_lose_no_committed_state(tmp_path):
    # Workers 2..21 on 127.0.0.2 each die 4 steps after joining; a zero
    # cool-down readmits the host at once. Worker 22 stays.
    out = elastic_run(tmp_path, "127.0.0.1:2\n127.0.0.2:1\n",
                      ["--min-np", "2", "--max-np", "3", "--blacklist-cooldown-range", "0", "0"],
                      KILL_WIDS=",".join(map(str, range(2, 22))), UNTIL_WID=22, STEPS=10,
                      STEP_SLEEP=0.01, timeout=300)
    sizes = check_result(out)
    deaths = re.findall(r"^tfring-run: elastic: worker (\d+) \(pid \d+\) on 127.0.0.2 was "
                        r"killed by SIGKILL$", out.stderr, re.M)
    assert deaths == [str(w) for w in range(2, 22)], out.show
    assert out.stderr.count("host 127.0.0.2 readmitted") == 20, out.show
    assert len({j["pid"] for j in out.joins if j["wid"] in (0, 1)}) == 2, out.show
    assert 3 in sizes and 2 in sizes, sizes


def test_reset_limit_stops_the_job(tmp_path):
    out = elastic_run(tmp_path, "127.0.0.1:2\n127.0.0.2:1\n",
                      ["--min-np", "2", "--max-np", "3", "--blacklist-cooldown-range", "0", "0",
                       "--reset-limit", "3"],
                      KILL_WIDS=",".join(map(str, range(2, 22))), UNTIL_WID=22, STEPS=10,
                      STEP_SLEEP=0.01)
    assert out.returncode == 1, out.show
    assert "the job re-formed 4 times, over --reset-limit 3" in out.stderr, out.show
    assert "the job was stopped" in out.stderr, out.show


def test_hung_member_that_does_not_report_is_dropped(tmp_path):
    # Worker 2 stops (SIGSTOP) mid-training: no process exits. The others'
    # collectives fail (TFRING_TIMEOUT) and they report it; worker 2 does
    # not report within TFRING_ELASTIC_REPORT_GRACE, so the driver takes it
    # as hung, blacklists its host and re-forms without it.
    out = elastic_run(tmp_path, "127.0.0.1:2\n127.0.0.2:1\n", ["--min-np", "2", "--max-np", "3"],
                      STOP_WIDS="2", STEPS=40, STEP_SLEEP=0.02, TFRING_TIMEOUT=6,
                      TFRING_ELASTIC_REPORT_GRACE=2)
    sizes = check_result(out)
    assert sizes[0] == 3 and sizes[-1] == 2, sizes
    assert re.search(r"worker 2 \(pid \d+\) on 127.0.0.2 did not report within 2 s", out.stderr), \
        out.show
    assert "host 127.0.0.2 blacklisted" in out.stderr, out.show


def test_every_worker_failing_ends_the_job_at_once_with_the_first_error(tmp_path):
    # A script error on every rank: every host is blacklisted for good and
    # discovery lists no other, so nothing can re-form the job. The driver
    # stops at once, far below the 600 s --elastic-timeout.
    start = time.monotonic()
    out = elastic_run(tmp_path, "127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n",
                      ["--min-np", "2", "--max-np", "3"], timeout=90,
                      FAIL_STEP=3, STEPS=20)
    took = time.monotonic() - start
    assert out.returncode == 1, out.show  # the failed workers' code (ValueError: 1)
    assert took < 60, (took, out.show)
    m = re.search(r"^tfring-run: elastic: error: every worker has failed and no host can be "
                  r"admitted \(blacklisted: 127.0.0.1, 127.0.0.2, 127.0.0.3\); first error: "
                  r"worker (\d) \(pid \d+\) on (\S+) exited with code 1 \(it was rank (\d)\): "
                  r"ValueError: step 3 failed on rank (\d) \(worker (\d)\)$", out.stderr, re.M)
    assert m, out.show
    wid, host, rank, said_rank, said_wid = m.groups()
    # The error named is that worker's own, and it was the first to be seen.
    assert (wid, rank) == (said_wid, said_rank), out.show
    joined = {str(j["wid"]): j for j in out.joins}
    assert joined[wid]["host"] == host and str(joined[wid]["rank"]) == rank, out.show
    first_exit = re.search(r"elastic: (worker \d \(pid \d+\) on \S+) exited with code",
                           out.stderr)
    assert first_exit and first_exit.group(1).startswith(f"worker {wid} "), out.show


def test_all_failed_waits_while_a_host_can_still_be_admitted():
    # Driver logic alone: the job ends only when no host can be admitted.
    import math
    import types

    from tfring.run import elastic

    args = types.SimpleNamespace(min_num_proc=2, max_num_proc=4, np=None,
                                 elastic_timeout=None)
    ended = []

    def driver(hosts, blacklist):
        d = elastic.Driver(args, ["true"], relay=None)
        d.pool.hosts, d.pool.blacklist = hosts, blacklist
        d.first_failure, d.first_code = (None, "worker 0 exited with code 3"), 3
        d._fail = lambda why, code: ended.append((why, code))
        d._check_all_failed()
        return d

    driver({"a": 1, "b": 1}, {"a": math.inf, "b": time.monotonic() + 30})  # b's cool-down ends
    driver({"a": 1, "c": 1}, {"a": math.inf})  # discovery lists a new host c
    driver({}, {"a": math.inf})  # discovery lists nothing (yet)
    assert ended == []
    driver({"a": 1, "b": 1}, {"a": math.inf, "b": math.inf})
    assert len(ended) == 1 and ended[0][1] == 3, ended
    assert "blacklisted: a, b); first error: worker 0 exited with code 3" in ended[0][0]


@pytest.mark.parametrize("stagger", [0.7, -0.7])  # rank 0 leaves first / last
def test_planned_departures_and_staggered_exits_log_no_error(tmp_path, stagger):
    # Discovery removes a host mid-training (its workers leave at a commit),
    # and at the end the ranks exit 0.7 s apart, shutting down at exit: no
    # process failed, so no line may read as a failure.
    grow = tmp_path / "hosts.txt"
    out = elastic_run(tmp_path, "127.0.0.1:2\n127.0.0.2:2\n", ["--min-np", "2", "--max-np", "4"],
                      STEPS=10, GROW_FILE=grow, GROW_STEP=4, GROW_LINES="127.0.0.1:2",
                      GROW_SIZE=2, STEP_SLEEP=0.02, EXIT_STAGGER=stagger)
    sizes = check_result(out)
    assert sizes[0] == 4 and sizes[-1] == 2, sizes
    assert "host 127.0.0.2 removed by discovery" in out.stderr, out.show
    for wid in (2, 3):  # the removed workers say why they leave, in one line
        assert re.search(rf"^\[{wid}\]<stderr>:tfring elastic: worker {wid} is not in "
                         r"membership epoch 1 \(host 127.0.0.2 removed by discovery\); leaving$",
                         out.stderr, re.M), out.show
    for bad in ("ERROR", "Traceback", "exited with code", "killed by", "error"):
        assert bad not in out.stderr, (bad, out.show)
