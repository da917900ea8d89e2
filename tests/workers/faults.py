"""Fault scenarios; each rank reports the error it saw (class, text, time)."""

import os
import signal
import socket
import sys
import threading
import time

import numpy as np

from common import report

import tfring.basics as basics
from tfring import _core

scenario = sys.argv[1]
basics.init()
rank, n = basics.rank(), basics.size()
t0 = time.time()
seen = {"error": None, "message": "", "elapsed": None}


def data_links(keep_ports):
    """This process's connected TCP sockets whose remote port is not in
    keep_ports (from /proc: fd -> socket inode -> /proc/net/tcp row)."""
    inodes = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes[target[8:-1]] = int(fd)
    fds = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                remote, state, inode = cols[2], cols[3], cols[9]
                if state == "01" and inode in inodes and \
                        int(remote.rsplit(":", 1)[1], 16) not in keep_ports:
                    fds.append(inodes[inode])
    return fds


def other_results():
    """The result files the other ranks write when they report
    (multiproc.run_ranks names them after this rank's TFRING_RESULT); none
    when this rank has no TFRING_RESULT of that form."""
    mine = os.environ.get("TFRING_RESULT", "")
    suffix = f".{rank}.json"
    if not mine.endswith(suffix):
        return []
    return [mine[:-len(suffix)] + f".{r}.json" for r in range(n) if r != rank]


# Run by a helper process: SIGKILLs PID once every FILE has existed (the
# test removes each one after its rank exits), or after AT_MOST seconds.
_KILL_LATER = """
import os, sys, time
pid, end, files = int(sys.argv[1]), time.time() + float(sys.argv[2]), set(sys.argv[3:])
seen = set()
while time.time() < end and not (files and seen == files):
    seen |= {f for f in files if os.path.exists(f)}
    time.sleep(0.05)
os.kill(pid, 9)
"""


def kill_once_others_reported(at_most_s):
    """Has a helper process SIGKILL this rank once every other rank has
    reported the error it saw (so each saw this rank alive, not dead), or
    after at_most_s seconds. The test can then end: multiproc.run_ranks
    waits for every rank."""
    import subprocess
    subprocess.Popen([sys.executable, "-c", _KILL_LATER, str(os.getpid()), str(at_most_s),
                      *other_results()])


def wait_for(path, timeout=30):
    """Until another rank has created `path` (at most `timeout` s)."""
    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)


def attempt(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        seen.update(error=type(e).__name__, message=str(e), elapsed=time.time() - t0,
                    bases=[c.__name__ for c in type(e).__mro__])


if scenario == "shape":
    attempt(lambda: _core.allreduce(np.ones(4 + (rank == 1), np.float32), name="grad/bad"))
elif scenario == "dtype":
    attempt(lambda: _core.allreduce(np.ones(4, np.float64 if rank == 2 else np.float32),
                                    name="grad/bad"))
elif scenario == "op":
    attempt(lambda: _core.allreduce(np.ones(4, np.float32), op="max" if rank == 1 else "sum",
                                    name="grad/bad"))
elif scenario == "root":
    attempt(lambda: _core.broadcast(np.ones(4, np.float32), root=rank % 2, name="weights/bad"))
elif scenario == "allgather_shape":
    attempt(lambda: _core.allgather(np.ones((2, 3 + (rank == 1)), np.float32), name="emb/bad"))
elif scenario == "missing":
    if rank == 1:
        # Away until every other rank has reported the error it saw (its
        # result file exists, multiproc.run_ranks), at most SLEEP seconds.
        others = other_results()
        deadline = time.time() + float(os.environ["SLEEP"])
        while time.time() < deadline and not (others and all(map(os.path.exists, others))):
            time.sleep(0.05)
    else:
        attempt(lambda: _core.allreduce(np.ones(4, np.float32), name="lonely"))
elif scenario == "duplicate":
    h = _core.allreduce_async(np.ones(4, np.float32), name="twice")
    attempt(lambda: _core.allreduce_async(np.ones(4, np.float32), name="twice"))
    h.wait(30)
elif scenario == "duplicate_batch":
    # A grouped op of mixed dtypes is one batch (tensors "g.0", "g.1"): when
    # one of its names is already in flight, none of it is taken, and the
    # others stay free.
    flag = os.environ["FLAG"]
    if rank == 1:  # rank 0's "g.1" stays in flight until rank 0 has tried
        wait_for(flag)
    else:
        import tensorflow as tf

        import tfring
    h = _core.allreduce_async(np.ones(4, np.float64), name="g.1")
    if rank == 0:
        attempt(lambda: tfring.grouped_allreduce(
            [tf.ones([3]), tf.ones([4], tf.float64)], op=tfring.Sum, name="g"))
        open(flag, "w").close()
    seen["g.0"] = _core.allreduce(np.ones(3, np.float32), name="g.0").tolist()
    seen["g.1"] = h.wait(30).tolist()
elif scenario == "duplicate_group":
    # A grouped op of one dtype is one request named after the op: a
    # collective of that name in flight refuses it; it runs once the name is
    # free. Rank 1 submits "p" only once rank 0 has tried, so rank 0's "p"
    # is surely still in flight then.
    import tensorflow as tf

    import tfring

    flag = os.environ["FLAG"]
    if rank == 1:
        wait_for(flag)
    h = _core.allreduce_async(np.ones(4, np.float32), name="p")
    if rank == 0:
        attempt(lambda: tfring.grouped_allreduce([tf.ones([3]), tf.ones([4])],
                                                 op=tfring.Sum, name="p"))
        open(flag, "w").close()
    seen["p"] = h.wait(30).tolist()
    seen["group"] = [t.numpy().tolist() for t in tfring.grouped_allreduce(
        [tf.ones([3]), tf.ones([4])], op=tfring.Sum, name="p")]
elif scenario in ("die_idle", "die_busy"):
    victim = int(os.environ["VICTIM"])
    _core.allreduce(np.ones(10, np.float32), name="warmup")
    if rank == victim:
        if scenario == "die_idle":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    x = np.ones(4 << 20, np.float32)

    def loop():
        for i in range(100000):
            _core.allreduce(x, name=f"busy.{i}")
    attempt(loop)
elif scenario == "die_fast":
    # The same once the name is cached: the survivors are in rounds and
    # fast-path collectives (no coordinator round trip) when the victim dies.
    victim = int(os.environ["VICTIM"])
    x = np.ones(1024, np.float32)
    for _ in range(3):
        _core.allreduce(x, name="fast", out=x)
    if rank == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()

    def fast_loop():
        for i in range(10 ** 7):
            _core.allreduce(x, name="fast", out=x)
    attempt(fast_loop)
elif scenario == "stopped":
    # The victim is stopped (SIGSTOP), not dead: its connections stay up, so
    # only its silence gives it away. A helper process kills it later so the
    # test can end.
    victim = int(os.environ["VICTIM"])
    x = np.ones(1024, np.float32)
    for _ in range(3):
        _core.allreduce(x, name="stop.warm", out=x)
    if rank == victim:
        # Once the survivors have reported, at the latest past the test's
        # bound on their errors (TFRING_TIMEOUT of 5 s plus 2): they must
        # have named a stopped rank, not a dead one.
        kill_once_others_reported(10)
        os.kill(os.getpid(), signal.SIGSTOP)

    def stop_loop():
        for i in range(10 ** 7):
            _core.allreduce(x, name="stop.warm", out=x)
    attempt(stop_loop)
elif scenario == "late_ranks":
    # Rank 0 shuts down while the others still have work of their own to do
    # before theirs: its shutdown does not wait for them until TFRING_TIMEOUT,
    # and what they submit afterwards fails naming rank 0.
    _core.allreduce(np.ones(4, np.float32), name="late.warm")
    if rank == 0:
        t = time.time()
        basics.shutdown()
        seen["shutdown_s"] = time.time() - t
        report(seen)
        sys.exit(0)
    # Busy until rank 0 has shut down and reported (its result file exists,
    # multiproc.run_ranks), and a second more; at most SLEEP seconds.
    mine = os.environ.get("TFRING_RESULT", "")
    first = mine[:-len(f".{rank}.json")] + ".0.json" if mine.endswith(f".{rank}.json") else None
    deadline = time.time() + float(os.environ.get("SLEEP", "6"))
    while time.time() < deadline and not (first and os.path.exists(first)):
        time.sleep(0.05)
    time.sleep(max(0.0, min(1.0, deadline - time.time())))
    attempt(lambda: _core.allreduce(np.ones(4, np.float32), name="late.after"))
elif scenario == "cached_shape":
    # A name every rank has run before comes back with a new shape on one
    # rank only: that rank leaves the fast path, and the others must follow
    # it to the coordinator to hear about the mismatch.
    for _ in range(3):
        _core.allreduce(np.ones(4, np.float32), name="grad/cached")
    attempt(lambda: _core.allreduce(np.ones(4 + (rank == 1), np.float32), name="grad/cached"))
    y = _core.allreduce(np.ones(4, np.float32), op="sum", name="grad/cached")
    z = _core.allreduce(np.ones(4, np.float32), op="sum", name="grad/cached")
    seen["after"] = y.tolist() + z.tolist()
elif scenario == "gpu_die_busy":
    # The same on GPU tensors: the survivors are inside the GPU ring (waiting
    # on the dead rank's counters or events) when it dies.
    victim = int(os.environ["VICTIM"])
    device = int(os.environ.get("TFRING_TEST_DEVICE", "0"))
    g = _core.CudaArray.from_numpy(np.ones(1 << 20, np.float32), device)
    _core.allreduce(g, name="gpu.warmup")
    if rank == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()

    def gpu_loop():
        for i in range(100000):
            _core.allreduce(g, name=f"gpu.busy.{i}", out=g)
    attempt(gpu_loop)
elif scenario == "cut_links":
    # The victim's data links drop while its process and its coordinator
    # connection stay up (as when its data network fails): only the ranks at
    # the other end of those links can tell, and every rank must hear the
    # victim named first, not the rank that noticed. The victim then stops
    # (SIGSTOP) so that it reports nothing itself; a helper kills it later.
    victim = int(os.environ["VICTIM"])
    x = np.ones(1 << 16, np.float32)
    for _ in range(3):
        _core.allreduce(x, name="cut.warm", out=x)
    if rank == victim:
        host, port = os.environ["TFRING_STORE_ADDR"].rsplit(":", 1)
        store = _core.TcpStore(host, int(port), os.environ["TFRING_SECRET"], 10.0)
        keep = {int(port), int(store.get("coord/port", 10.0))}  # store and coordinator

        def cut():
            time.sleep(0.3)
            # Once the survivors have reported, at the latest after the
            # test's 15 s bound on their errors.
            kill_once_others_reported(16)
            for fd in data_links(keep):
                s = socket.socket(fileno=fd)
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.detach()
            os.kill(os.getpid(), signal.SIGSTOP)
        threading.Thread(target=cut, daemon=True).start()

    def cut_loop():
        for i in range(10 ** 7):
            _core.allreduce(x, name="cut.loop", out=x)
    attempt(cut_loop)
elif scenario == "after_error":
    # A mismatch fails one tensor, not the job: later collectives still work.
    attempt(lambda: _core.allreduce(np.ones(4 + rank, np.float32), name="grad/bad"))
    y = _core.allreduce(np.ones(3, np.float32), op="sum", name="grad/good")
    seen["after"] = y.tolist()
report(seen)
# Survivors of a dead peer shut down normally too: that is what lets the
# coordinator's Abort reach every rank before rank 0's process goes away.
basics.shutdown()
