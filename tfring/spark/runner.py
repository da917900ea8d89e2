"""tfring.spark.run: a tfring job whose ranks are the tasks of one Spark
barrier stage (Horovod's horovod.spark.run, same arguments).

The driver (this process, holding the SparkContext, or a Spark Connect
client: _connect.py):
  * hosts the job's rendezvous store, the same TcpStoreServer tfring-run
    hosts, under a fresh secret, on an address the executors reach;
  * hosts the monitor (_monitor.py): every rank connects to it while ``fn``
    runs, relays its output there, and reports how ``fn`` ended;
  * submits ``num_proc`` tasks as one barrier stage (so Spark starts them
    together or not at all) in a job group (Connect: under a tag) of its
    own, from a thread, and
    waits for the first of: the job's end, a rank's error, a rank's death,
    a failed Spark task, or start_timeout with ranks missing. On anything
    but the end it cancels the job group (Spark kills the other tasks, and
    no retry of the stage runs into the old store) and raises
    SparkJobError naming the rank and its Spark task.
The tasks' side is _task.py.
"""

import os
import queue
import re
import secrets
import socket
import sys
import threading
import time
import warnings

from tfring.run.common import ERROR_LINE
from tfring.spark._connect import ClassicStage, ConnectStage, connect_session, \
    default_parallelism
from tfring.spark._connect import driver_address as connect_driver_address
from tfring.spark._monitor import Monitor
from tfring.spark._task import host_identity, run_task

DEFAULT_START_TIMEOUT_S = 600
_job_counter = [0]


class SparkJobError(RuntimeError):
    """A tfring job in Spark failed: ``rank`` (None when no rank had joined
    yet), its Spark ``partition`` and ``attempt`` where known, and Spark's
    own error text (``spark_error``) when the job ended with one."""

    def __init__(self, message, rank=None, partition=None, attempt=None, spark_error=None):
        super().__init__(message)
        self.rank = rank
        self.partition = partition
        self.attempt = attempt
        self.spark_error = spark_error


class JobSpec:
    """What every task of one job gets (pickled by Spark with cloudpickle).
    The secret travels with it: turn on Spark's RPC encryption
    (spark.network.crypto.enabled) where the cluster's network is shared."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _active_session():
    """("classic", SparkContext) or ("connect", a Spark Connect session)."""
    import pyspark

    sc = pyspark.SparkContext._active_spark_context
    if sc is not None:
        return "classic", sc
    session = connect_session()
    if session is not None:
        return "connect", session
    raise RuntimeError("tfring.spark: no active SparkContext or Spark Connect session; create "
                       "a SparkSession (SparkSession.builder.getOrCreate(), or "
                       ".remote('sc://...') for Spark Connect) before calling run()")


def _driver_address(sc):
    """(address the executors connect to, address to listen on)."""
    master = sc.master or ""
    if master == "local" or master.startswith("local["):
        return "127.0.0.1", "127.0.0.1"  # the executor is this process's JVM
    from tfring import _tunables

    if _tunables.raw("TFRING_IFACE_ADDR") or _tunables.raw("TFRING_IFACE"):
        from tfring import _core

        addr = _core._listen_address()
        return addr, addr
    conf = sc.getConf()
    host = conf.get("spark.driver.host") or socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = host
    # A driver in a container may bind to another address than it advertises.
    bind = "0.0.0.0" if conf.get("spark.driver.bindAddress") else addr
    return addr, bind


def _task_env(env, nics):
    """The variables each task sets around fn: the driver's TFRING_* and
    HOROVOD_* tunables (as tfring-run forwards them to remote ranks), then
    ``env``, then the NIC; never a launcher's per-rank or per-job variables,
    which the task sets itself."""
    launcher = _launcher_vars()
    out = {k: v for k, v in os.environ.items()
           if (k.startswith("TFRING_") or k.startswith("HOROVOD_")) and k not in launcher}
    out.update({str(k): str(v) for k, v in (env or {}).items() if str(k) not in launcher})
    if nics:
        nics = sorted(set([nics] if isinstance(nics, str) else nics))
        if len(nics) > 1:
            raise ValueError(f"tfring.spark: nics={nics}: tfring binds every rank to one "
                             "interface (TFRING_IFACE); name one")
        out["TFRING_IFACE"] = nics[0]
    return out


def _launcher_vars():
    """The variables a launcher sets per rank or per job (tfring-run's, the
    elastic driver's, horovodrun's): each task sets its own or none, never
    the driver's or the executor's."""
    from tfring import _tunables
    from tfring.run.common import RANK_VARS

    hvd = [f"HOROVOD_{n}" for n in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                                     "CROSS_SIZE", "HOSTNAME")]
    return set(RANK_VARS) | {t.name for t in _tunables.PYTHON if t.launcher} | set(hvd)


def _spark_task_of(text):
    """(partition, attempt) of the failed task Spark's error names, or Nones."""
    m = re.search(r"Lost task (\d+)\.(\d+) in stage", text or "")
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.search(r"ResultTask\(\d+, (\d+)\)", text or "")
    return (int(m.group(1)), None) if m else (None, None)


def _first_lines(text, n=6):
    """The head of Spark's error, and the Python exception a worker raised
    (the traceback's last line, far below the head in Spark's text)."""
    lines = [ln for ln in str(text).splitlines() if ln.strip()]
    head = lines[:n]
    python = [s for s in (ln.strip() for ln in lines) if ERROR_LINE.match(s)
              and "Py4J" not in s and not s.startswith(("org.", "java.", "scala."))]
    if python and python[0] not in "\n".join(head):
        head.append(f"(the Python worker raised: {python[0]})")
    return "\n".join(head)


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, use_mpi=None,
        use_gloo=None, extra_mpi_args=None, env=None, stdout=None, stderr=None,
        verbose=1, nics=None, prefix_output_with_timestamp=False, executable=None):
    """Runs ``fn(*args, **kwargs)`` as a tfring job of ``num_proc`` ranks,
    each a task of one Spark barrier stage, and returns fn's results in rank
    order. ``fn`` calls ``tfring.init()`` (or ``tfring.keras.init()``) as in
    any tfring script; its stdout and stderr reach ``stdout``/``stderr``
    (default: this process's) line by line as Horovod writes them,
    ``[rank]<stdout>:line``, after the local time with
    ``prefix_output_with_timestamp``. From a Spark Connect session (no
    SparkContext in this process) the stage is a DataFrame's
    mapInArrow(barrier=True) (_connect.py).

    num_proc: ranks (default: the SparkContext's defaultParallelism).
    start_timeout: seconds for all tasks to start and join (default:
        HOROVOD_SPARK_START_TIMEOUT, else 600).
    use_mpi / extra_mpi_args: tfring starts no mpirun in Spark; use_mpi=True
        is refused. use_gloo is accepted (tfring's own TCP is the Gloo mode's
        counterpart).
    env: variables set in every task around ``fn`` (the driver's TFRING_*
        and HOROVOD_* tunables are passed on too).
    nics: one network interface for the ranks (TFRING_IFACE).
    executable: a Python interpreter on the executors: each task then runs
        ``fn`` in a fresh process of it, as Horovod's tasks do (its output
        at the file-descriptor level reaches the driver too); it needs
        tfring and pyspark (for cloudpickle). Default: ``fn`` runs in Spark's
        Python worker (PYSPARK_PYTHON) itself, which Spark reuses from job
        to job.
    Raises SparkJobError naming the first rank to fail and its Spark task.
    """
    if not callable(fn):
        raise TypeError(f"tfring.spark.run: fn must be callable, got {type(fn).__name__}")
    if use_mpi:
        raise ValueError("tfring.spark.run: use_mpi=True is not supported: the ranks run in "
                         "the Spark tasks themselves and meet through tfring's own store "
                         "(leave use_mpi unset)")
    if extra_mpi_args:
        warnings.warn("tfring.spark.run: extra_mpi_args has no effect (no mpirun is started)",
                      RuntimeWarning, stacklevel=2)
    kind, sc = _active_session()
    inferred = ""
    if num_proc is None and kind == "connect":
        num_proc, inferred = default_parallelism(sc)
    elif num_proc is None:
        num_proc = sc.defaultParallelism
        inferred = " (spark.default.parallelism)"
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"tfring.spark.run: num_proc must be a positive int, got {num_proc!r}")
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT",
                                             DEFAULT_START_TIMEOUT_S))
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    task_env = _task_env(env, nics)

    from tfring.run.common import format_addr, start_store

    _job_counter[0] += 1
    job_id = f"tfring.spark.run.{os.getpid()}.{_job_counter[0]}"
    secret = secrets.token_hex(16)
    if kind == "connect":
        addr, bind, loopback = connect_driver_address(sc)
        stage = ConnectStage(sc, job_id)
    else:
        (addr, bind), loopback = _driver_address(sc), False
        stage = ClassicStage(sc, job_id)
    server, why = start_store(bind, secret)
    if server is None:
        raise RuntimeError(f"tfring.spark: cannot host the rendezvous store: {why}")
    monitor = Monitor(bind, secret, stdout, stderr, prefix_output_with_timestamp)
    args, kwargs = tuple(args), dict(kwargs or {})
    payload = None
    if executable is not None:
        if not isinstance(executable, str) or not executable:
            raise TypeError(f"tfring.spark.run: executable must be a path, got {executable!r}")
        from pyspark import cloudpickle

        # Pickled here, unpickled only in fn's own process (_exec_fn.py).
        payload, fn, args, kwargs = cloudpickle.dumps((fn, args, kwargs)), None, (), {}
    spec = JobSpec(job_id=job_id, fn=fn, args=args, kwargs=kwargs, executable=executable,
                   payload=payload, size=num_proc, store_addr=format_addr(addr, server.port),
                   secret=secret,
                   monitor_addr=(addr, monitor.port), env=task_env,
                   clear_env=sorted(_launcher_vars() - set(task_env)),
                   start_timeout=float(start_timeout),
                   # A task on this machine connects through loopback (Connect).
                   loopback_on=host_identity() if loopback else None)
    if verbose >= 1:
        stderr.write(f"tfring.spark: running {num_proc} ranks{inferred} as one barrier "
                     f"stage; store at {spec.store_addr}\n")
    try:
        return _run_job(stage, spec, monitor, verbose, stderr)
    finally:
        monitor.close()
        server.stop()


def _run_job(stage, spec, monitor, verbose, stderr):
    outcome = {}

    def spark_job():
        try:
            outcome["result"] = stage.collect(spec, run_task)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            outcome["error"] = e
        finally:
            monitor.events.put(("spark-end",))

    thread = threading.Thread(target=spark_job, name="tfring-spark-job", daemon=True)
    thread.start()
    try:
        return _wait(stage, spec, monitor, verbose, stderr, outcome, thread)
    except SparkJobError:
        raise  # the job is cancelled already
    except BaseException:
        # Interrupted (Ctrl-C) or broken here: the tasks must not run on.
        stage.cancel()
        raise


def _wait(stage, spec, monitor, verbose, stderr, outcome, thread):
    start_deadline = time.monotonic() + spec.start_timeout
    next_poll = 0.0
    failure = None
    while failure is None:
        try:
            ev = monitor.events.get(timeout=0.2)
        except queue.Empty:
            ev = None
        if ev is not None:
            if ev[0] in ("error", "died"):
                failure = ev
            elif ev[0] == "spark-end":
                if "error" not in outcome:
                    break
                failure = _late_event(monitor) or ("spark",)
            elif ev[0] == "joined" and verbose >= 2:
                stderr.write(f"tfring.spark: {monitor.describe(ev[1])} joined\n")
            continue
        now = time.monotonic()
        if monitor.registered() < spec.size and now > start_deadline:
            failure = ("start-timeout",)
        elif now >= next_poll:
            next_poll = now + 0.5
            if stage.failed_tasks():
                # The task's own report may be on its way: wait for it briefly.
                failure = _late_event(monitor, 2.0) or ("spark",)
    if failure is None:
        results = sorted(outcome["result"], key=lambda pair: pair[0])
        return [r for _, r in results]
    failure, later = _cause(failure, monitor)
    stage.cancel()
    thread.join(60.0)
    raise _job_error(failure, later, monitor, spec, outcome.get("error"))


def _late_event(monitor, wait_s=0.5):
    """The first error or death reported within ``wait_s``, else None."""
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            ev = monitor.events.get(timeout=left)
        except queue.Empty:
            return None
        if ev[0] in ("error", "died"):
            return ev


def _rank_of_cause(ev):
    """0: a rank's own error; 1: a rank's death; 2: a rank told by tfring of
    a failure elsewhere; 3: not a rank's report."""
    if ev[0] == "error":
        return 2 if ev[4] else 0
    return 1 if ev[0] == "died" else 3


# How long the driver waits after a report for one that would explain it
# better: each rank's report travels on its own connection, so a survivor's
# "peer died" may arrive before the dead rank's connection is seen closed.
_CAUSE_WAIT_S = {0: 0.3, 1: 1.0, 2: 2.0, 3: 2.0}


def _cause(first, monitor):
    """(the failure to name, the other reports seen meanwhile)."""
    seen = [first]
    deadline = time.monotonic() + _CAUSE_WAIT_S[_rank_of_cause(first)]
    while True:
        best = min(seen, key=_rank_of_cause)
        ev = _late_event(monitor, min(deadline, time.monotonic()
                                      + _CAUSE_WAIT_S[_rank_of_cause(best)]) - time.monotonic())
        if ev is None:
            break
        seen.append(ev)
    best = min(seen, key=_rank_of_cause)  # stable: the earliest of the best kind
    return best, [ev for ev in seen if ev is not best and ev[0] in ("error", "died")]


def _job_error(failure, later, monitor, spec, spark_error):
    kind = failure[0]
    spark_text = _first_lines(spark_error) if spark_error is not None else None
    if kind in ("error", "died"):
        rank = failure[1]
        hello = monitor.ranks.get(rank, {})
        who = monitor.describe(rank)
        if kind == "error":
            msg = f"tfring.spark: {who} failed: {failure[2]}\n{failure[3].rstrip()}"
        elif failure[2] is None:
            msg = (f"tfring.spark: {who} died without a result (its Python worker exited: "
                   "killed, os._exit or a crash)")
        else:
            msg = f"tfring.spark: {who} died without a result: fn's process {failure[2]}"
        others = [f"{monitor.describe(ev[1])} " + ("failed: " + ev[2] if ev[0] == "error"
                                                   else "died")
                  for ev in later if ev[1] != rank]
        if others:
            msg += "\nthen: " + "; ".join(others[:8])
        return SparkJobError(msg, rank, hello.get("partition"), hello.get("attempt"),
                             spark_text)
    if kind == "start-timeout":
        return SparkJobError(
            f"tfring.spark: only {monitor.registered()} of {spec.size} ranks joined within "
            f"start_timeout={spec.start_timeout:g}s: Spark starts a barrier stage only when "
            f"it can run all {spec.size} tasks at once; check that the cluster has "
            f"{spec.size} free task slots, or raise start_timeout"
            + (f"\nSpark: {spark_text}" if spark_text else ""), spark_error=spark_text)
    partition, attempt = _spark_task_of(str(spark_error))
    where = (f"Spark partition {partition}" + (f", attempt {attempt}" if attempt is not None
                                               else "")) if partition is not None else \
        "a Spark task"
    return SparkJobError(f"tfring.spark: {where} failed before its rank joined the job"
                         + (f"\nSpark: {spark_text}" if spark_text else ""),
                         None, partition, attempt, spark_text)


def run_elastic(fn, args=(), kwargs=None, num_proc=None, min_num_proc=None,
                max_num_proc=None, start_timeout=None, elastic_timeout=None, reset_limit=None,
                env=None, stdout=None, stderr=None, verbose=1, nics=None,
                prefix_output_with_timestamp=False, min_np=None, max_np=None):
    """Not available in Spark: raises NotImplementedError saying what to use.

    Horovod's signature, with its deprecated ``min_np``/``max_np`` (which
    warn as Horovod's do) for ``min_num_proc``/``max_num_proc``. tfring's
    elastic driver (tfring-run --min-np/--max-np) starts, stops and
    blacklists worker processes on hosts it discovers; a Spark job cannot
    add tasks to a running stage, and a barrier stage, whose tasks start and
    fail together, is what keeps a fixed-size job from hanging. See
    docs/spark.md."""
    if min_np is not None:
        min_num_proc = min_np
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning,
                      stacklevel=2)
    if max_np is not None:
        max_num_proc = max_np
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning,
                      stacklevel=2)
    raise NotImplementedError(
        "tfring.spark.run_elastic is not supported: tfring's elastic driver manages worker "
        "processes on hosts it discovers, which a Spark stage cannot grow or shrink. Use "
        "tfring.spark.run (a fixed number of ranks; resume from a checkpoint after a failure), "
        "or run elastic jobs outside Spark with tfring-run --min-np/--max-np "
        "--host-discovery-script (docs/elastic.md)")
