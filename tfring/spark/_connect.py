"""How tfring.spark.run submits its barrier stage: through the SparkContext
of a classic session, or through a Spark Connect session, which has none.

Spark Connect (``SparkSession.builder.remote("sc://host")``) has no RDDs
and no SparkContext, but a DataFrame's ``mapInArrow(..., barrier=True)``
runs a barrier stage, whose tasks get a BarrierTaskContext like an RDD
barrier stage's. So over Connect:

  * the stage is ``spark.range(0, n, 1, n)`` (n partitions of one row) mapped
    by ``mapInArrow(barrier=True)``; each task runs _task.run_task and yields
    one row: its rank and fn's result, cloudpickled;
  * the job is tagged (``addTag``, a tag of the calling thread) and
    cancelled with ``interruptTag``, as a classic job group is cancelled;
  * ``num_proc`` defaults to spark.default.parallelism where the server
    sets it, else to the N of a ``local[N]`` master; otherwise it must be
    given;
  * the client is the driver of the tfring job: it hosts the store and the
    monitor, and the executors, which may run elsewhere, connect to it. It
    listens on every interface, or on the one TFRING_IFACE/TFRING_IFACE_ADDR
    names, and advertises its host's address; a task on the client's own
    machine connects through loopback instead (_task.py).
"""

import os
import pickle
import re
import socket
import sys


class ClassicStage:
    """The barrier stage of a classic session: an RDD barrier stage in a job
    group of its own."""

    def __init__(self, sc, job_id):
        self.sc, self.job_id = sc, job_id

    def collect(self, spec, run_task):
        self.sc.setJobGroup(self.job_id, f"tfring job of {spec.size} ranks",
                            interruptOnCancel=True)
        rdd = self.sc.parallelize(range(spec.size), spec.size).barrier()
        return rdd.mapPartitions(lambda _: run_task(spec)).collect()

    def cancel(self):
        self.sc.cancelJobGroup(self.job_id)

    def failed_tasks(self):
        tracker = self.sc.statusTracker()
        failed = 0
        for job_id in tracker.getJobIdsForGroup(self.job_id):
            info = tracker.getJobInfo(job_id)
            for stage_id in (info.stageIds if info else ()):
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    failed += stage.numFailedTasks
        return failed


class ConnectStage:
    """The barrier stage of a Spark Connect session (module docstring)."""

    def __init__(self, session, job_id):
        self.session, self.tag = session, re.sub(r"[^A-Za-z0-9_-]", "-", job_id)

    def collect(self, spec, run_task):
        def task(batches):
            import pyarrow as pa
            from pyspark import cloudpickle

            for rank, result in run_task(spec):
                yield pa.RecordBatch.from_pylist(
                    [{"rank": rank, "result": cloudpickle.dumps(result)}])

        self.session.addTag(self.tag)  # this thread's operations only
        try:
            rows = (self.session.range(0, spec.size, 1, spec.size)
                    .mapInArrow(task, "rank long, result binary", barrier=True).collect())
        finally:
            self.session.removeTag(self.tag)
        return [(row["rank"], pickle.loads(row["result"])) for row in rows]

    def cancel(self):
        try:
            self.session.interruptTag(self.tag)
        except Exception:  # noqa: BLE001 - the session may be closing
            pass

    def failed_tasks(self):
        return 0  # Connect has no status tracker: failures come with collect()


def connect_session():
    """The active Spark Connect session of this thread, or the default one,
    or None; without importing Spark Connect's client where nothing did."""
    mod = sys.modules.get("pyspark.sql.connect.session")
    if mod is None:
        return None
    return mod.SparkSession.getActiveSession() or mod.SparkSession._get_default_session()


def default_parallelism(session):
    value = session.conf.get("spark.default.parallelism", None)
    if value:
        return int(value), " (spark.default.parallelism)"
    master = session.conf.get("spark.master", None) or ""
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if m:
        n = m.group(1) or "1"
        return (os.cpu_count() or 1) if n == "*" else int(n), f" (the master, {master})"
    raise ValueError("tfring.spark.run: num_proc is needed with Spark Connect: the server "
                     "sets no spark.default.parallelism and its master is " + repr(master))


def driver_address(session):
    """(address the executors connect to, address to listen on, whether a
    task on this machine should use loopback instead) for a Connect client."""
    from tfring import _tunables

    if _tunables.raw("TFRING_IFACE_ADDR") or _tunables.raw("TFRING_IFACE"):
        from tfring import _core

        addr = _core._listen_address()
        return addr, addr, False
    host = getattr(getattr(session, "client", None), "host", "") or ""
    if host.strip("[]") in ("localhost", "127.0.0.1", "::1"):
        master = session.conf.get("spark.master", None) or ""
        if master == "local" or master.startswith("local["):
            return "127.0.0.1", "127.0.0.1", False  # server and executors on this machine
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = socket.gethostname()
    return addr, "0.0.0.0", True
