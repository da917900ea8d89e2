"""The Spark task side of tfring.spark.run: one barrier task is one rank.

Each task of the barrier stage, in order:

  1. refuses to run as a retry (a later attempt of the task): the
     first attempt's ranks may still hold the job's store keys, and a job
     that lost a rank does not resume in Spark (see docs/spark.md);
  2. tells every other task its host through ``BarrierTaskContext.allGather``
     and derives the whole placement from the answers, the same on every
     task: hosts in the order of their lowest partition id, and within a
     host, partitions in order. Ranks are numbered host by host, so the
     ranks of a host are consecutive and local_rank/cross_rank follow;
  3. connects to the driver's monitor (a TCP connection that lives as long
     as the rank: its end without a final message tells the driver that the
     rank's Python worker died) and relays ``fn``'s stdout/stderr over it;
  4. sets the variables ``tfring.init()`` reads, as tfring-run sets them in
     a rank (TFRING_RANK ... TFRING_STORE_ADDR, TFRING_SECRET), binds the
     worker to the rank's share of the host's cores as tfring-run binds its
     ranks (unless TFRING_BIND=none), runs ``fn``, shuts tfring down if
     ``fn`` left it initialized, and puts the Python worker's environment,
     core mask and streams back as they were: Spark reuses the worker for
     later tasks, later jobs included. With ``run(..., executable=...)``
     ``fn`` runs in a process of that interpreter instead, started here with
     this environment and core mask (_exec_fn.py).
"""

import hmac
import json
import os
import re
import socket
import sys
import threading
import traceback

from tfring.run import affinity
from tfring.run.affinity import machine_identity as host_identity
from tfring.spark._exec_fn import FnEnded, run_fn_process
from tfring.spark._protocol import auth_token, is_secondary, recv_line, send_line

_LINE_END = re.compile("([\r\n])")


def placement(partition_hosts):
    """{partition: (rank, local_rank, local_size, cross_rank, cross_size, host)}
    from [(partition, host)], following Horovod: the ranks of a host are
    consecutive, hosts come in the order of their lowest partition (so
    partition 0 is rank 0), and cross_rank is this host's index among the
    hosts that have a rank with this local_rank."""
    by_host = {}
    for part, host in sorted(partition_hosts):
        by_host.setdefault(host, []).append(part)
    hosts = list(by_host)  # insertion order: lowest partition first
    out, rank = {}, 0
    for h_index, host in enumerate(hosts):
        parts = by_host[host]
        for local_rank, part in enumerate(parts):
            peers = [i for i, h in enumerate(hosts) if len(by_host[h]) > local_rank]
            out[part] = (rank, local_rank, len(parts), peers.index(h_index), len(peers), host)
            rank += 1
    return out


class _Relay:
    """A text stream whose whole lines go to the driver as one message each."""

    def __init__(self, conn, lock, name, fallback):
        self._conn, self._lock, self._name, self._fallback = conn, lock, name, fallback
        self._buf = ""
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, text):
        if not isinstance(text, str):
            text = str(text)
        # A line ends at "\n", or at "\r" (a progress bar redrawing its line),
        # and travels with that character, as Horovod forwards output.
        for piece in _LINE_END.split(text):
            self._buf += piece
            if piece in ("\n", "\r"):
                self._send(self._buf)
                self._buf = ""
        return len(text)

    def flush(self):
        pass

    def close_line(self):
        if self._buf:
            self._send(self._buf)
            self._buf = ""

    def _send(self, line):
        try:
            send_line(self._conn, {"out": self._name, "line": line}, self._lock)
        except OSError:
            self._fallback.write(line if line.endswith(("\n", "\r")) else line + "\n")

    def isatty(self):
        return False

    def fileno(self):
        return self._fallback.fileno()


def _connect(addr, secret, hello, timeout):
    host, port = addr
    conn = socket.create_connection((host, port), timeout=timeout)
    conn.settimeout(timeout)
    hello = dict(hello, token=auth_token(secret))
    send_line(conn, hello)
    reply = recv_line(conn)
    if not reply or not hmac.compare_digest(str(reply.get("token", "")),
                                            auth_token(secret, "driver")):
        conn.close()
        raise RuntimeError(f"tfring.spark: the driver's monitor at {host}:{port} did not "
                           "answer this job's handshake")
    conn.settimeout(None)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return conn


def run_task(job):
    """The body of one barrier task; ``job`` is the driver's JobSpec.
    Returns [(rank, fn's result)]."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    part, attempt = ctx.partitionId(), ctx.attemptNumber()
    if attempt > 0:
        raise RuntimeError(
            f"tfring.spark: partition {part} started again (attempt {attempt}) after a "
            f"failure of job {job.job_id}; "
            "a tfring job does not resume within Spark: the driver reports the first failure")
    host = host_identity()
    answers = ctx.allGather(json.dumps([part, host]))
    places = placement([tuple(json.loads(a)) for a in answers])
    rank, local_rank, local_size, cross_rank, cross_size, _ = places[part]

    hello = {"rank": rank, "partition": part, "attempt": attempt,
             "task_id": ctx.taskAttemptId(), "stage": ctx.stageId(),
             "host": socket.gethostname(), "pid": os.getpid()}
    store_addr, monitor_addr = job.store_addr, job.monitor_addr
    if getattr(job, "loopback_on", None) == host:
        # A Spark Connect client listening on every interface, on this
        # machine: its advertised address may not route back here.
        from tfring.run.common import format_addr

        store_addr = format_addr("127.0.0.1", int(store_addr.rsplit(":", 1)[1]))
        monitor_addr = ("127.0.0.1", monitor_addr[1])
    conn = _connect(monitor_addr, job.secret, hello, job.start_timeout)
    lock = threading.Lock()

    rank_env = {
        "TFRING_RANK": rank, "TFRING_SIZE": job.size,
        "TFRING_LOCAL_RANK": local_rank, "TFRING_LOCAL_SIZE": local_size,
        "TFRING_CROSS_RANK": cross_rank, "TFRING_CROSS_SIZE": cross_size,
        "TFRING_STORE_ADDR": store_addr, "TFRING_SECRET": job.secret,
        "TFRING_HOSTNAME": host,
        "HOROVOD_RANK": rank, "HOROVOD_SIZE": job.size,
        "HOROVOD_LOCAL_RANK": local_rank, "HOROVOD_LOCAL_SIZE": local_size,
        "HOROVOD_CROSS_RANK": cross_rank, "HOROVOD_CROSS_SIZE": cross_size,
        "HOROVOD_HOSTNAME": host,
    }
    env = dict(job.env)
    env.update({k: str(v) for k, v in rank_env.items()})
    saved_env = {k: os.environ.get(k) for k in list(env) + list(job.clear_env)}
    saved_streams = sys.stdout, sys.stderr
    saved_cpus = _bind(local_rank, local_size, env)
    out = _Relay(conn, lock, "stdout", sys.__stdout__)
    err = _Relay(conn, lock, "stderr", sys.__stderr__)
    for k in job.clear_env:  # an outer launcher's, which tfring.init() would follow
        os.environ.pop(k, None)
    os.environ.update(env)
    sys.stdout, sys.stderr = out, err
    try:
        if job.executable:
            result = run_fn_process(job, out, err)
        else:
            result = _run_fn_here(job)
    except FnEnded as e:  # fn's own process reported its end: pass that on
        out.close_line()
        err.close_line()
        _report(conn, lock, e.report)
        _close(conn)
        raise RuntimeError(f"tfring.spark: rank {rank}: {e}") from None
    except BaseException as e:
        out.close_line()
        err.close_line()
        _report(conn, lock, {"error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(),
                             "secondary": is_secondary(e)})
        _leave()
        _close(conn)
        raise
    finally:
        sys.stdout, sys.stderr = saved_streams
        affinity.unbind_process(saved_cpus)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out.close_line()
    err.close_line()
    _leave()
    _report(conn, lock, {"done": True})
    _close(conn)
    return [(rank, result)]


def _run_fn_here(job):
    """fn in this Python worker (``run`` without ``executable``)."""
    from tfring import basics

    if basics.is_initialized():
        basics.shutdown()
    # The store is new for every job; a reused worker's count of earlier
    # joins (which prefixes a later join's keys) must start over, the same
    # on every rank.
    basics._joins = 0
    return job.fn(*job.args, **job.kwargs)


def _bind(local_rank, local_size, env):
    """Binds this Python worker to the rank's slice of the host's cores, as
    tfring-run binds the ranks it starts (tfring/run/affinity.py), unless
    TFRING_BIND=none; returns the mask to put back when the task ends (Spark
    reuses the worker). Unbound, two ranks on one host share their cores
    with each other's progress loops and thread pools and each step takes
    longer."""
    if not affinity.binding_enabled({**os.environ, **env}):
        return None
    return affinity.bind_process(affinity.slice_for(local_rank, local_size))



def _leave():
    """Leaves the tfring job if fn did not: the peers' pending collectives
    fail at once, and the reused worker can join the next job."""
    try:
        from tfring import basics

        if basics.is_initialized():
            basics.shutdown()
    except Exception:  # noqa: BLE001 - the job's result or error is what matters
        pass


def _close(conn):
    try:
        conn.close()
    except OSError:
        pass


def _report(conn, lock, msg):
    try:
        send_line(conn, msg, lock)
    except OSError:
        pass


__all__ = ["host_identity", "placement", "run_task"]
