"""Binding local ranks to their own cores (tfring/run/affinity.py): the
slices on made-up topologies, and what tfring-run's ranks really get."""

import ast
import json
import os
import subprocess
import sys

import pytest

from tfring.run import affinity

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _topology(monkeypatch, cores, threads):
    """CPU c is hyperthread c // cores of core c % cores, as Linux numbers
    a one-package machine with SMT."""
    def read(path):
        cpu = int(path.split("/cpu")[-1].split("/")[0])
        if path.endswith("physical_package_id"):
            return "0"
        if cpu >= cores * threads:
            raise OSError(path)
        return str(cpu % cores)
    monkeypatch.setattr(affinity, "_read", read)


def test_hyperthreads_of_a_core_stay_together(monkeypatch):
    _topology(monkeypatch, cores=4, threads=2)
    cpus = range(8)
    assert affinity.core_groups(cpus) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert affinity.slice_for(0, 2, cpus) == [0, 1, 4, 5]
    assert affinity.slice_for(1, 2, cpus) == [2, 3, 6, 7]


@pytest.mark.parametrize("cores,ranks", [(4, 3), (16, 5), (7, 7), (2, 1)])
def test_slices_are_disjoint_cover_every_core_and_differ_by_one(monkeypatch, cores, ranks):
    _topology(monkeypatch, cores=cores, threads=1)
    slices = [affinity.slice_for(r, ranks, range(cores)) for r in range(ranks)]
    flat = [c for s in slices for c in s]
    assert sorted(flat) == list(range(cores))
    assert len(set(flat)) == cores
    sizes = [len(s) for s in slices]
    assert max(sizes) - min(sizes) <= 1
    # Contiguous: a rank's cores are neighbours (one cache, one NUMA node).
    for s in slices:
        assert s == list(range(s[0], s[0] + len(s)))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_children_start_on_their_cpus_and_the_parent_keeps_its_own():
    # The child reports its mask as its first act: bound after it started,
    # it could report (and start threads on) every CPU.
    mine = os.sched_getaffinity(0)
    cpu = max(mine)
    with affinity.inherited([cpu]) as taken:
        out = subprocess.run([sys.executable, "-c",
                              "import os; print(sorted(os.sched_getaffinity(0)))"],
                             capture_output=True, text=True, timeout=60).stdout
    assert taken
    assert ast.literal_eval(out.strip()) == [cpu]
    assert os.sched_getaffinity(0) == mine
    with affinity.inherited(None) as taken:
        assert not taken and os.sched_getaffinity(0) == mine


def test_more_ranks_than_cores_binds_nothing(monkeypatch):
    _topology(monkeypatch, cores=2, threads=2)
    assert affinity.slice_for(0, 3, range(4)) is None
    with pytest.raises(ValueError, match="local rank 2"):
        affinity.slice_for(2, 2, range(4))


def test_without_topology_each_cpu_is_a_core(monkeypatch):
    def read(path):
        raise OSError(path)
    monkeypatch.setattr(affinity, "_read", read)
    assert affinity.slice_for(1, 2, [5, 6, 7, 8]) == [7, 8]
    assert affinity.describe([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def _masks(*launch):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TFRING_BIND", None)
    prog = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-m", "tfring.run", *launch, sys.executable, "-c", prog],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    masks = {}
    for line in out.splitlines():
        rank, _, mask = line.partition("<stdout>:")
        masks[int(rank.strip("[]"))] = ast.literal_eval(mask)
    return masks


@pytest.mark.skipif(len(affinity.core_groups(affinity.allowed_cpus())) < 2,
                    reason="needs two cores")
def test_tfring_run_binds_local_ranks_to_disjoint_cores():
    mine = affinity.allowed_cpus()
    bound = _masks("-np", "2")
    assert set(bound) == {0, 1}
    assert bound[0] == affinity.slice_for(0, 2) and bound[1] == affinity.slice_for(1, 2)
    assert not set(bound[0]) & set(bound[1])
    assert _masks("--bind-to", "none", "-np", "2") == {0: mine, 1: mine}
    # More ranks than cores: all share every core.
    many = len(affinity.core_groups(mine)) + 1
    assert _masks("-np", str(many)) == {r: mine for r in range(many)}


def test_remote_ranks_bind_through_their_own_interpreter():
    cmd = ["python3", "train.py", "--x"]
    assert affinity.wrap_remote(cmd, 1, 4) == [
        "python3", "-m", "tfring.run.affinity", "1", "4", "--", "python3", "train.py", "--x"]
    assert affinity.wrap_remote(["./train.sh"], 0, 2) == ["./train.sh"]
    # What the remote host runs: bound to its slice, then the command itself.
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    prog = "import os; print(sorted(os.sched_getaffinity(0)))"
    for r in (0, 1):
        out = subprocess.run(affinity.wrap_remote([sys.executable, "-c", prog], r, 2), env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        want = affinity.slice_for(r, 2) or affinity.allowed_cpus()
        assert ast.literal_eval(out) == want


@pytest.mark.skipif(len(affinity.core_groups(affinity.allowed_cpus())) < 2,
                    reason="needs two cores")
def test_elastic_workers_get_their_slots_cores(tmp_path):
    # Each worker prints its mask, then waits (up to 30 s) until both have
    # printed, so a worker that exits first cannot end the job before a slow
    # one has started; then they exit (the job fails after
    # --elastic-timeout): only the masks they printed matter here.
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TFRING_BIND", None)
    prog = ("import os, time; print(sorted(os.sched_getaffinity(0)), flush=True); "
            f"d = {str(tmp_path)!r}; open(os.path.join(d, str(os.getpid())), 'w').close(); "
            "t = time.time() + 30\n"
            "while len(os.listdir(d)) < 2 and time.time() < t: time.sleep(0.05)")
    out = subprocess.run([sys.executable, "-m", "tfring.run", "--min-np", "2", "--max-np", "2",
                          "--elastic-timeout", "2", "-H", "localhost:2",
                          sys.executable, "-c", prog],
                         env=env, capture_output=True, text=True, timeout=60).stdout
    masks = sorted(ast.literal_eval(line.partition("<stdout>:")[2])
                   for line in out.splitlines() if "<stdout>:" in line)
    assert masks == sorted([affinity.slice_for(0, 2), affinity.slice_for(1, 2)])


@pytest.mark.skipif(len(affinity.allowed_cpus()) < 2, reason="needs 2 CPUs to tell masks apart")
def test_bind_process_moves_threads_already_running_and_unbind_puts_them_back():
    # In a process of its own: a Spark worker or Ray actor already runs
    # threads when its rank is bound, and they must move too.
    code = (
        "import json, os, threading\n"
        "from tfring.run import affinity\n"
        "mask = lambda: sorted(os.sched_getaffinity(0))\n"
        "full = mask()\n"
        "go, back, seen = threading.Event(), threading.Event(), {}\n"
        "def worker():\n"
        "    go.wait(); seen['bound'] = mask()\n"
        "    back.wait(); seen['back'] = mask()\n"
        "t = threading.Thread(target=worker); t.start()\n"
        "old = affinity.bind_process(full[1:2])\n"
        "go.set()\n"
        "later = threading.Thread(target=lambda: seen.update(later=mask()))\n"
        "later.start(); later.join()\n"
        "while 'bound' not in seen: pass\n"
        "affinity.unbind_process(old)\n"
        "back.set(); t.join()\n"
        "print(json.dumps(dict(seen, full=full, main=mask(), none=affinity.bind_process(None))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    full = got["full"]
    assert got["bound"] == full[1:2] and got["later"] == full[1:2]
    assert got["back"] == full and got["main"] == full and got["none"] is None
