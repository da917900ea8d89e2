"""Functions as jobs: ship a Python function to every rank through the job's
rendezvous store and collect what it returns, in rank order.

The protocol, in keys of the store (values are pickles):

- ``fn/payload``: what every rank runs, ``serialize(fn, args, kwargs)``; the
  driver (the process that calls the function job) sets it before the ranks
  start.
- ``fn/started/<rank>``: set by a rank once it has connected and read the
  payload (before unpickling it, which may import TensorFlow); a start
  timeout names the ranks whose key is missing.
- ``fn/result/<rank>``: set by a rank when the function returns or raises:
  ``("ok", value)`` or ``("error", type name, message, traceback text,
  the exception pickled or None)``.

A rank runs ``python -m tfring.run.fn_job`` (``main``), which reads the store
address, secret and rank from the TFRING_* variables any tfring launcher
sets, and exits 0 after a result, 1 after an error. The driver reads the
results once every rank has ended (``collect``) and turns the first failure
into a ``RankFailedError`` naming the rank.

The pieces stand alone so other ways of starting ranks (a Spark job, Ray
actors) can reuse them: ``serialize``/``load`` for the payload, ``execute``
to run it in a rank, ``publish`` to post the outcome, ``collect`` to read
every rank's back. tfring.runner.run is the ``tfring-run`` driver.
"""

import os
import pickle
import sys
import time
import traceback

try:  # functions defined in __main__, lambdas and closures need cloudpickle
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - cloudpickle is a dependency
    _pickler = pickle

__all__ = ["PAYLOAD_KEY", "RankFailedError", "StartTimeoutError", "collect", "execute",
           "load", "main", "publish", "result_key", "serialize", "started_key"]

PAYLOAD_KEY = "fn/payload"


def started_key(rank):
    return f"fn/started/{rank}"


def result_key(rank):
    return f"fn/result/{rank}"


class RankFailedError(RuntimeError):
    """A rank of a function job raised, died, or never reported.

    ``rank``: the rank; ``remote_traceback``: the traceback text it sent (or
    None); ``exception``: the exception it raised, when it could be
    unpickled here (else None); ``signal``: the signal name that killed it
    (or None)."""

    def __init__(self, message, rank, remote_traceback=None, exception=None, signal=None):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.exception = exception
        self.signal = signal


class StartTimeoutError(RankFailedError, TimeoutError):
    """Ranks that did not start in time; ``missing`` lists them."""

    def __init__(self, message, missing):
        super().__init__(message, missing[0] if missing else None)
        self.missing = missing


def serialize(fn, args=(), kwargs=None):
    """The payload bytes of ``fn(*args, **kwargs)``. With cloudpickle (a
    tfring dependency) functions travel by value; with plain pickle only by
    reference, so ``fn`` must be importable by its module name in a rank."""
    try:
        return _pickler.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise TypeError(f"cannot pickle the function job {fn!r} or its arguments "
                        f"({type(e).__name__}: {e})") from e


def load(payload):
    return pickle.loads(payload)


def execute(payload):
    """Runs a payload; returns the bytes to publish (never raises for an
    exception of the function itself)."""
    try:
        fn, args, kwargs = load(payload)
        return _pickler.dumps(("ok", fn(*args, **kwargs)))
    except BaseException as e:  # noqa: BLE001 - every failure goes to the driver
        text = traceback.format_exc()
        try:
            exc = _pickler.dumps(e)
            pickle.loads(exc)  # one the driver cannot rebuild is sent as text only
        except Exception:  # noqa: BLE001
            exc = None
        return pickle.dumps(("error", type(e).__name__, str(e), text, exc))


def is_error(blob):
    return pickle.loads(blob)[0] == "error"


def publish(store, rank, blob):
    store.set(result_key(rank), blob)


def _error_from(rank, outcome):
    _, name, message, text, exc = outcome
    exception = None
    if exc is not None:
        try:
            exception = pickle.loads(exc)
        except Exception:  # noqa: BLE001 - the text still names it
            exception = None
    return RankFailedError(
        f"rank {rank} raised {name}: {message}\n\nRemote traceback (rank {rank}):\n"
        f"{text.rstrip()}", rank, text, exception)


def collect(store, size, deaths=None, first_failed=None, timeout_s=5.0):
    """Every rank's return value in rank order, or raises RankFailedError.

    Call it once the ranks have ended. ``deaths``: {rank: what ended it}
    for ranks known to have died ("was killed by signal SIGKILL", or
    "exited with code 3"); ``first_failed``: the rank whose failure stopped
    the job, whose error is the one raised when it sent one. A rank that
    raised is named before one that died without a result (killed while the
    job stopped because of the first)."""
    deaths = deaths or {}
    outcomes = {}
    for rank in range(size):
        key = result_key(rank)
        try:
            # Ranks published before ending; only a rank that never got
            # there lacks its key, so no long wait.
            if store.check([key]):
                outcomes[rank] = pickle.loads(store.get(key, timeout_s))
        except Exception as e:  # noqa: BLE001 - a result that cannot be read
            raise RankFailedError(f"cannot read rank {rank}'s result: "
                                  f"{type(e).__name__}: {e}", rank) from e
    errors = [r for r in range(size) if r in outcomes and outcomes[r][0] == "error"]
    if errors:
        rank = first_failed if first_failed in errors else errors[0]
        raise _error_from(rank, outcomes[rank])
    missing = [r for r in range(size) if r not in outcomes]
    if missing:
        rank = first_failed if first_failed in missing else missing[0]
        what = deaths.get(rank, "ended without returning a result")
        sig = what.rsplit(" ", 1)[-1] if "signal" in what else None
        raise RankFailedError(f"rank {rank} {what} before returning a result"
                              if rank in deaths else f"rank {rank} {what}", rank, signal=sig)
    return [outcomes[r][1] for r in range(size)]


class StartWatch:
    """The poll() interface tfring.run.common.Job.wait takes: a message once
    some rank has not read the payload within ``timeout_s``."""

    def __init__(self, store, size, timeout_s):
        self.store = store
        self.keys = [started_key(r) for r in range(size)]
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.next_check = 0.0
        self.done = False
        self.missing = []

    def poll(self):
        now = time.monotonic()
        if self.done or now < self.next_check:
            return None
        self.next_check = now + 0.2
        if self.store.check(self.keys):
            self.done = True
            return None
        if now < self.deadline:
            return None
        self.done = True
        self.missing = [int(k.rsplit("/", 1)[1]) for k in self.keys
                        if not self.store.check([k])]
        return (f"start timeout: rank(s) {', '.join(map(str, self.missing))} did not start "
                f"within {self.timeout_s:g} s; terminating all ranks")


def main():
    """A rank of a function job (``python -m tfring.run.fn_job``)."""
    from tfring import _bootstrap, _core

    addr = os.environ.get("TFRING_STORE_ADDR")
    rank = os.environ.get("TFRING_RANK")
    if not addr or rank is None:
        sys.stderr.write("tfring.run.fn_job: TFRING_STORE_ADDR and TFRING_RANK must be set "
                         "(run it through tfring.runner.run)\n")
        return 2
    rank = int(rank)
    host, port = _bootstrap._split_addr(addr)
    store = _core.TcpStore(host, port, os.environ.get("TFRING_SECRET", ""), 60.0)
    payload = store.get(PAYLOAD_KEY, 60.0)
    store.set(started_key(rank), b"1")
    blob = execute(payload)
    publish(store, rank, blob)
    sys.stdout.flush()
    sys.stderr.flush()
    return 1 if is_error(blob) else 0


if __name__ == "__main__":
    sys.exit(main())
