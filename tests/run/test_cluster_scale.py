"""A job's services at scale: the rendezvous store serving 200 clients
from one thread, and many hosts.

The store server runs in a child process so that its threads and fds can
be counted from /proc/<pid> without counting the test's own client
threads.

Many hosts: H network-namespace hosts of L core-only ranks each (no
TensorFlow), started with the env-var bootstrap. The `cluster_hosts`
fixture takes (H, L) by indirect parametrisation, up to 32 x 4, and removes
every namespace and process whatever the test does. CI runs 8 x 4;
TFRING_TEST_SLOW=1 adds 32 x 4 (128 ranks), the last host's link cut at
16 x 4 and 32 x 4, and a rank killed on the last host of 32. A failure
must be named first in every survivor's error: the failed rank, not the
rank that noticed it. benchmarks/cluster_bench.py runs end to end on two
unshaped namespace hosts: every algorithm job runs, checks its results
exactly against the expected sum (a wrong sum fails the job) and runs the
algorithm it was asked for.

Every wait has a deadline: a hang fails the test."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import cluster
import wire_util
from multiproc import first_rank_named
from tfring import _core

_WHY = cluster.why_unavailable()
needs_cluster = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))
SLOW = bool(os.environ.get("TFRING_TEST_SLOW"))
# float32 sums of up to 128 standard normals against the float64 sum.
TOLERANCE = 1e-4


# ------------------------------------------------------ the store, 200 clients --

SECRET = "scale-secret"
N = 200

SERVER = (
    "import sys\n"
    "from tfring import _core\n"
    "s = _core.TcpStoreServer('127.0.0.1', 0, sys.argv[1])\n"
    "print(s.port, flush=True)\n"
    "sys.stdin.read()\n"
    "s.stop()\n"
)


@pytest.fixture
def server_proc():
    p = subprocess.Popen([sys.executable, "-c", SERVER, SECRET], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        yield p, port
    finally:
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _client(port):
    return _core.TcpStore("127.0.0.1", port, SECRET, 30.0)


def _wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_200_clients_with_blocked_waits_share_one_server_thread(server_proc):
    proc, port = server_proc
    main = _client(port)
    main.set("up", b"1")
    base_threads, base_fds = _threads(proc.pid), _fds(proc.pid)

    connected = threading.Barrier(N + 1, timeout=120)
    errors, done = [], []

    def rank(r):
        try:
            c = _client(port)
            c.set(f"rank/{r}", str(r).encode())
            c.add("arrived", 1)
            connected.wait()
            if r % 2 == 0:
                # Parked server-side until the odd neighbour sets both keys.
                c.add("parked", 1)
                c.wait([f"late/{r}", f"late/{r + 1}"], 120.0)
                vals = c.get_many([f"late/{r}", f"late/{r + 1}"], 5.0)
                assert vals == [f"{r + 1}->{r}".encode(), f"{r + 1}->{r + 1}".encode()], vals
            else:
                c.add("parked", 1)
                c.wait(["release"], 120.0)  # parked until the test releases everyone
                c.set(f"late/{r - 1}", f"{r}->{r - 1}".encode())
                c.set(f"late/{r}", f"{r}->{r}".encode())
            other = (r * 7 + 3) % N
            assert c.get(f"rank/{other}", 5.0) == str(other).encode()
            if r == 0:
                with pytest.raises(_core.TfringTimeoutError, match=r"\[never\]"):
                    c.wait(["late/0", "never"], 0.3)
            done.append((r, c.add("done", 1)))
        except BaseException as e:  # reported below, never hangs the test
            errors.append((r, repr(e)))
            connected.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(N)]
    for t in threads:
        t.start()
    try:
        connected.wait()
    except threading.BrokenBarrierError:
        pytest.fail(f"clients failed before all connected: {errors[:5]}")
    # Every client holds its connection now: the server has a socket each,
    # and still the threads it had with one client.
    assert _fds(proc.pid) >= base_fds + N
    idle_threads = _threads(proc.pid)

    # All N clients send a WAIT that cannot be answered yet.
    _wait_for(lambda: int(main.get("parked", 5.0)) == N, 60, "every client to park a WAIT")
    time.sleep(0.3)  # let the last WAITs reach the server
    parked_threads = _threads(proc.pid)
    assert not main.check(["late/0"]) and not errors, errors[:5]

    main.set("release", b"go")
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "clients hung"
    assert not errors, errors[:5]
    assert sorted(n for _, n in done) == list(range(1, N + 1))
    assert int(main.get("arrived", 1.0)) == N

    assert idle_threads <= base_threads + 1, (base_threads, idle_threads)
    assert parked_threads <= base_threads + 1, (base_threads, parked_threads)


def _frame(payload):
    return struct.pack("<I", len(payload)) + payload


def test_parked_waits_of_vanished_clients_are_dropped(server_proc):
    proc, port = server_proc
    main = _client(port)
    main.set("up", b"1")
    base_fds = _fds(proc.pid)
    socks = []
    for i in range(50):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert wire_util.handshake(s, SECRET)
        key = f"never/{i}".encode()
        # WAIT u32 n, n strings, i64 timeout_us (csrc/rendezvous/tcp_store.cc)
        s.sendall(_frame(b"\x05" + struct.pack("<I", 1) + struct.pack("<I", len(key)) + key
                         + struct.pack("<q", 600_000_000)))
        socks.append(s)
    _wait_for(lambda: _fds(proc.pid) >= base_fds + 50, 10, "the raw clients to connect")
    for s in socks:
        s.close()
    # The server notices each parked client leave and closes its socket,
    # without waiting for the ten-minute deadline they sent.
    _wait_for(lambda: _fds(proc.pid) <= base_fds, 10, "the server to drop the parked WAITs")
    main.set("never/3", b"late")  # wakes nobody: the waiter is gone
    assert main.get("never/3", 1.0) == b"late"


def test_large_values_reach_many_readers_at_once(server_proc):
    # Replies larger than a socket buffer go out in pieces as each reader's
    # socket drains; readers blocked in GET get the whole value once it is set.
    _, port = server_proc
    value = os.urandom(8 << 20)
    got, errors = {}, []

    def reader(i):
        try:
            got[i] = _client(port).get("big", 60.0)
        except BaseException as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    _client(port).set("big", value)
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(got) == 16 and all(v == value for v in got.values())


# ------------------------------------------------------------------ many hosts --

class Job:
    """The hosts of one cluster and how to start L ranks on each."""

    def __init__(self, c, per_host):
        self.cluster, self.per_host = c, per_host
        self.size = per_host * len(c.hosts)
        self.dir = tempfile.mkdtemp(prefix="tfring-scale-")

    def start(self, args, env=None):
        # auto, not the workers' default ring: the algorithms chosen at scale.
        env = dict({"CLUSTER_ALGO": "auto", "TFRING_TIMEOUT": "120"}, **(env or {}))
        _, procs = cluster.start_ranks(self.cluster, self.per_host, args, self.dir, env=env)
        return procs

    def reports(self):
        return cluster.read_reports(self.dir, self.size)


@pytest.fixture
def cluster_hosts(request):
    hosts, per_host = request.param
    assert hosts <= 32 and per_host <= 8, "the subnet and this machine's patience"
    cluster.cleanup_leftovers()
    c = cluster.Cluster(hosts)
    try:
        yield Job(c, per_host)
    finally:
        c.close()


def _check_collectives(job, outs):
    reps = job.reports()
    digests = {}
    for r, rep in enumerate(reps):
        assert rep is not None, f"rank {r} wrote no report: {outs[r][-1500:]}"
        assert rep["error"] is None, (r, rep["message"])
        assert (rep["rank"], rep["size"]) == (r, job.size)
        assert (rep["local_rank"], rep["local_size"]) == (r % job.per_host, job.per_host)
        assert (rep["cross_rank"], rep["cross_size"]) == (r // job.per_host,
                                                          len(job.cluster.hosts))
        for name, (digest, err) in rep["results"].items():
            assert err <= TOLERANCE, (r, name, err)
            digests.setdefault(name, set()).add(digest)
    # Every rank ends every collective with the same bytes.
    assert {k: len(v) for k, v in digests.items() if len(v) > 1} == {}


@needs_cluster
@pytest.mark.parametrize("cluster_hosts", [(8, 4)] + ([(32, 4)] if SLOW else []),
                         indirect=True, ids=lambda p: f"{p[0]}x{p[1]}")
def test_collectives_on_many_hosts(cluster_hosts):
    job = cluster_hosts
    procs = job.start(["collectives"])
    outs = cluster.wait_all(job.cluster, procs, 300 if job.size <= 32 else 900)
    _check_collectives(job, outs)


def _start_fault_stream(job, env):
    """Starts every rank in a stream of small allreduces and returns once
    all are in it (half a second after the last is ready)."""
    procs = job.start(["fault", "allreduce"], env=dict({"FAULT_ELEMS": "1024"}, **env))
    deadline = time.monotonic() + 600
    while sum(f.endswith(".ready") for f in os.listdir(job.dir)) < job.size:
        assert time.monotonic() < deadline, "the job did not start"
        assert all(p.poll() is None for p in procs), "a rank died during start-up"
        time.sleep(0.2)
    time.sleep(0.5)
    return procs


@needs_cluster
@pytest.mark.skipif(not SLOW, reason="128 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("cluster_hosts", [(32, 4)], indirect=True, ids=["32x4"])
def test_killed_rank_on_the_last_host_is_named_by_every_survivor(cluster_hosts):
    job = cluster_hosts
    victim = job.size - 1
    procs = _start_fault_stream(job, {})
    t_kill = time.time()
    os.kill(procs[victim].pid, signal.SIGKILL)
    cluster.wait_all(job.cluster, procs[:victim], 120)
    bad = []
    for r, rep in enumerate(job.reports()[:victim]):
        if rep is None or first_rank_named(rep["message"]) != victim:
            bad.append((r, rep and rep["message"][:200]))
        else:
            assert rep["t_error"] - t_kill < 10, (r, rep["t_error"] - t_kill)
    assert bad == [], bad


@needs_cluster
@pytest.mark.skipif(not SLOW, reason="64-128 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("cluster_hosts", [(16, 4), (32, 4)], indirect=True, ids=["16x4", "32x4"])
def test_cut_link_of_the_last_host_is_named_by_every_rank(cluster_hosts):
    # The last host's link to the switch goes down mid-stream: no process
    # dies, a link does. Every rank must fail within the bound, and name
    # the other side: ranks elsewhere a rank (or the address) of the cut
    # host, ranks on the cut host one elsewhere. No hangs.
    job = cluster_hosts
    cut = job.cluster.hosts[-1]
    cut_ranks = set(range(job.size - job.per_host, job.size))
    procs = _start_fault_stream(job, {"TFRING_TIMEOUT": "30"})
    t_cut = time.time()
    cut.link_down()
    cluster.wait_all(job.cluster, procs, 120)
    bad = []
    for r, rep in enumerate(job.reports()):
        if rep is None or not rep.get("error"):
            bad.append((r, "no error reported"))
            continue
        first = first_rank_named(rep["message"])
        other = cut_ranks if r not in cut_ranks else set(range(job.size)) - cut_ranks
        if not (first in other or (r not in cut_ranks and cut.addr in rep["message"])):
            bad.append((r, rep["message"][:200]))
        elif rep["t_error"] - t_cut > 40:
            bad.append((r, f"error after {rep['t_error'] - t_cut:.1f} s"))
    assert bad == [], bad


# ------------------------------------------------------- benchmarks/cluster_bench --

BENCH = os.path.join(cluster.ROOT, "benchmarks", "cluster_bench.py")


@needs_cluster
def test_cluster_bench_two_hosts(tmp_path):
    out_json = tmp_path / "r.json"
    p = subprocess.run([sys.executable, BENCH, "--rate", "0", "--sizes", "64K",
                        "--reps", "1", "--warmup", "1", "--json", str(out_json)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    if "skipped:" in p.stderr:
        pytest.skip(p.stderr.strip())
    assert "| 64 KiB |" in p.stdout, p.stdout
    jobs = json.load(open(out_json))["jobs"]
    assert set(jobs) == {"ring", "hier", "auto"}
    for algo in ("ring", "hier"):
        assert jobs[algo]["np"] == 4
        assert [r["ran"] for r in jobs[algo]["rows"]] == [[algo]], jobs[algo]
    # Above the default 32 KiB threshold, across equal hosts, auto is hier.
    assert jobs["auto"]["rows"][0]["ran"] == ["hier"], jobs["auto"]
