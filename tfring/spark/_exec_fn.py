"""``tfring.spark.run(..., executable=...)``: fn in a process of its own.

Horovod runs each rank's ``fn`` in a process that its Spark task starts
with ``executable`` (the driver's ``sys.executable`` by default);
tfring.spark.run runs ``fn`` in Spark's Python worker itself unless
``executable`` names an interpreter. Then each task, once it knows its rank
and has set the rank's variables and core mask (_task.py), starts

    <executable> -m tfring.spark._exec_fn FN_FILE RESULT_FILE PARENT_PID

in a fresh temporary directory, with the worker's environment (the rank's
variables included) and PYTHONPATH extended by the worker's own path
entries outside its installation (Spark's pyspark archive, files shipped
with ``addPyFile``), so the functions pickled by reference resolve alike.
FN_FILE holds ``(fn, args, kwargs)`` as the driver pickled them with
cloudpickle: the worker never unpickles ``fn``. The process:

  * asks the kernel to kill it when its parent, the Spark worker, dies (a
    cancelled Spark job kills the worker), and exits if the worker is gone
    already;
  * runs ``fn``, leaves the tfring job if ``fn`` did not, and writes
    ("done", result) or ("error", {"error", "traceback", "secondary"}) to
    RESULT_FILE, cloudpickled, through a rename, so a half-written file
    is never read;
  * writes its stdout and stderr (file descriptors 1 and 2: the native
    core's and TensorFlow's messages too) to pipes the task reads and
    relays to the driver line by line.

The process ending without a result file (killed, ``os._exit``, a crash) is
reported to the driver as that rank's death, with its exit code or signal.
"""

import codecs
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import traceback


class FnEnded(Exception):
    """fn's process failed or died; ``report`` is the task's last message
    to the driver (_protocol.py)."""

    def __init__(self, report):
        super().__init__(report.get("error") or f"fn's process {report.get('died')}")
        self.report = report


def run_fn_process(job, out, err):
    """Runs fn in a process of ``job.executable``, relaying its output to
    ``out``/``err`` (the task's relays); returns fn's result or raises
    FnEnded."""
    with tempfile.TemporaryDirectory(prefix="tfring-spark-fn-") as tmp:
        fn_file = os.path.join(tmp, "fn.pkl")
        result_file = os.path.join(tmp, "result.pkl")
        with open(fn_file, "wb") as f:
            f.write(job.payload)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            _worker_path() + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the driver as they are printed
        try:
            proc = subprocess.Popen(
                [job.executable, "-m", "tfring.spark._exec_fn", fn_file, result_file,
                 str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, cwd=tmp)
        except OSError as e:
            raise FnEnded({"error": f"cannot start executable={job.executable!r}: {e}",
                           "traceback": "", "secondary": False}) from None
        relays = [threading.Thread(target=_forward, args=(pipe, relay), daemon=True)
                  for pipe, relay in ((proc.stdout, out), (proc.stderr, err))]
        for t in relays:
            t.start()
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted here: fn must not run on
                proc.kill()
                proc.wait()
        for t in relays:
            t.join(10.0)
        out.close_line()
        err.close_line()
        try:
            with open(result_file, "rb") as f:
                kind, value = pickle.load(f)
        except FileNotFoundError:
            raise FnEnded({"died": _how_it_ended(job.executable, code)}) from None
    if kind == "done":
        return value
    raise FnEnded(value)


def _worker_path():
    """This worker's sys.path entries outside its Python installation."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    keep = []
    for p in sys.path:
        if not p or not os.path.exists(p):
            continue
        real = os.path.realpath(p)
        if any(real == q or real.startswith(q + os.sep) for q in prefixes):
            continue
        keep.append(p)
    return keep


def _how_it_ended(executable, code):
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"({executable}) was killed by {name}"
    return f"({executable}) exited with code {code} without a result"


def _forward(pipe, relay):
    """Copies a pipe to a relay as text: whole lines go on as they end, and
    a UTF-8 character split across reads is decoded whole."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = pipe.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        text = decoder.decode(data, final=not data)
        if text:
            relay.write(text)
        if not data:
            break
    pipe.close()


def _die_with_parent(parent):
    """PR_SET_PDEATHSIG: SIGKILL this process when the thread that started
    it (the Spark worker's task thread) ends; exit at once if it has ended
    already."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the worker's end leaves fn to tfring's own deadlines
    if os.getppid() != parent:
        os._exit(1)


def _dumps(obj):
    try:
        from pyspark import cloudpickle
    except ImportError:
        import cloudpickle
    return cloudpickle.dumps(obj)


def main(argv):
    fn_file, result_file, parent = argv[1], argv[2], int(argv[3])
    _die_with_parent(parent)
    try:
        with open(fn_file, "rb") as f:
            fn, args, kwargs = pickle.load(f)
        report = ("done", fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        from tfring.spark._protocol import is_secondary

        report = ("error", {"error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc(),
                            "secondary": is_secondary(e)})
    _leave()
    try:
        data = _dumps(report)
    except Exception as e:  # noqa: BLE001 - fn's result does not pickle
        data = _dumps(("error", {"error": f"fn's result cannot be pickled: "
                                          f"{type(e).__name__}: {e}",
                                 "traceback": traceback.format_exc(), "secondary": False}))
    with open(result_file + ".tmp", "wb") as f:
        f.write(data)
    os.rename(result_file + ".tmp", result_file)
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: TensorFlow's threads may hold it up, and the
    # result is written.
    os._exit(0)


def _leave():
    try:
        from tfring import basics

        if basics.is_initialized():
            basics.shutdown()
    except Exception:  # noqa: BLE001 - the job's result or error is what matters
        pass


if __name__ == "__main__":
    main(sys.argv)
