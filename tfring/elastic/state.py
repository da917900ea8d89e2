"""Elastic state and the retry loop, with Horovod's names and semantics.

A training function decorated with ``run`` gets a ``State``. The state is
committed (``commit()``: a copy kept in memory, then a check for membership
changes) every few batches. When the membership changes:

  * a collective fails (a peer died, a link broke): every survivor gets the
    collective's error (``HorovodInternalError`` is tfring's ``TfringError``),
    rolls its state back to the last commit (``restore()``), leaves the job
    (``tfring.shutdown()``) and joins the next membership (``tfring.init()``);
  * the driver published a new membership (hosts added or removed): the next
    ``commit()``/``check_host_updates()`` raises ``HostsUpdatedInterrupt`` on
    every rank at the same step (the ranks agree with a max-allreduce, so no
    rank is left behind in a collective); the state just committed is kept.

After joining, ``sync()`` broadcasts the state from rank 0 of the new
membership (a survivor: new workers get the highest ranks), then the reset
callbacks run and the training function is called again.
"""

import functools
import pickle
import re
import sys

import numpy as np

from tfring import _core, basics
from tfring.elastic import _worker

HorovodInternalError = _core.TfringError


class HostsUpdatedInterrupt(RuntimeError):
    """The job's membership changed; raised by commit()/check_host_updates()
    on every rank at the same step. skip_sync: hosts were only removed, so
    every remaining rank already holds the committed state."""

    def __init__(self, skip_sync=False):
        super().__init__("tfring elastic: the job's hosts changed")
        self.skip_sync = skip_sync


_bcast_calls = [0, None]  # [calls in this membership, the membership's core]


def _op_name(kind):
    # Collective names must match across ranks of one membership: a counter
    # restarted at every join (new members start at 0 like everyone else).
    epoch = _worker._worker.epoch if _worker._worker is not None else 0
    if _bcast_calls[1] != epoch:
        _bcast_calls[:] = [0, epoch]
    _bcast_calls[0] += 1
    return f"elastic.{kind}.{_bcast_calls[0]}"


def broadcast_object(obj, root_rank=0, name=None):
    """Pickles obj on root_rank and returns it on every rank."""
    if basics.size() == 1:
        return obj
    tag = name or _op_name("object")
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if basics.rank() == root_rank \
        else b""
    length = _core.broadcast(np.array([len(data)], np.int64), root=root_rank,
                             name=f"{tag}.len")
    buf = np.frombuffer(data, np.uint8).copy() if basics.rank() == root_rank \
        else np.zeros(int(length[0]), np.uint8)
    buf = _core.broadcast(buf, root=root_rank, name=f"{tag}.data")
    return obj if basics.rank() == root_rank else pickle.loads(buf.tobytes())


def broadcast_arrays(arrays, names, root_rank=0):
    """Broadcasts numpy arrays from root_rank. First checks that every rank
    holds the same names, shapes and dtypes, and names what differs."""
    manifest = [(n, tuple(a.shape), str(a.dtype)) for n, a in zip(names, arrays)]
    theirs = broadcast_object(manifest, root_rank)
    differs = np.zeros(basics.size(), np.int32)
    differs[basics.rank()] = theirs != manifest
    if basics.size() > 1:  # every rank raises, or none: no rank waits in a broadcast
        differs = _core.allreduce(differs, op="sum", name=_op_name("manifest"))
    bad = [int(r) for r in np.flatnonzero(differs)]
    if bad:
        detail = ""
        if theirs != manifest:
            diff = [f"{m[0]}: {m[1:]} here, {t[1:]} on rank {root_rank}"
                    for m, t in zip(manifest, theirs) if m != t]
            if len(theirs) != len(manifest):
                diff.insert(0, f"{len(manifest)} tensors here, {len(theirs)} on rank "
                            f"{root_rank}")
            detail = ": " + "; ".join(diff[:5])
        raise ValueError(f"tfring elastic: rank(s) {', '.join(map(str, bad))}'s state differs "
                         f"from rank {root_rank}'s and cannot be synchronized (this is rank "
                         f"{basics.rank()}){detail}")
    if basics.size() == 1:
        return [np.asarray(a) for a in arrays]
    return [np.asarray(_core.broadcast(np.ascontiguousarray(a), root=root_rank,
                                       name=_op_name("var"))).reshape(np.shape(a))
            for a in arrays]


def _agree_on_updates():
    """(update pending, hosts added) agreed by every rank (max over ranks)."""
    w = _worker._worker
    pending, added = w.update_pending() if w is not None else (False, False)
    if basics.size() == 1:
        return pending, added
    flags = _core.allreduce(np.array([pending, added], np.int32), op="max",
                            name="elastic.check_host_updates")
    return bool(flags[0]), bool(flags[1])


class State:
    """Base of the elastic states: commit/restore/sync and reset callbacks."""

    def __init__(self, bcast_object=broadcast_object, get_rank=None):
        self._bcast_object = bcast_object
        self._rank = get_rank or basics.rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every re-formation, before
        training resumes: e.g. to scale the learning rate by the new size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state in memory, then raises HostsUpdatedInterrupt if the
        membership changed. Every rank must call it at the same step."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        pending, added = _agree_on_updates()
        if pending:
            raise HostsUpdatedInterrupt(skip_sync=not added)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """State made of picklable attributes: ObjectState(epoch=0, batch=0)."""

    def __init__(self, bcast_object=broadcast_object, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def _as_internal_error(e):
    """A TensorFlow op's error that a failed membership raises (the core's
    status mapped to TF: peer failure, timeout, aborted), as HorovodInternalError."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    kinds = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
             tf.errors.AbortedError)
    msg = str(e)
    # A tfring op's error names the op (RingAllreduce...) or the peer rank.
    if isinstance(e, kinds) and ("Ring" in msg or "tfring" in msg.lower()
                                 or re.search(r"\brank \d+", msg)):
        err = HorovodInternalError(str(e))
        err.__cause__ = e
        return err
    return None


def reset():
    """Leaves the current membership and joins the next one."""
    basics.shutdown()
    basics.init()


def run_fn(func, reset_fn=reset):
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HostsUpdatedInterrupt:
                    raise
                except HorovodInternalError:
                    raise
                except Exception as e:
                    internal = _as_internal_error(e)
                    if internal is None:
                        raise
                    raise internal from e
            except HorovodInternalError as e:
                if _worker._worker is not None:
                    _worker._worker.report_failure(e)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            try:
                reset_fn()
            except _worker.RemovedFromJobError as e:
                # Left out of the next membership (its host was removed by
                # discovery, or the job shrank): a planned departure, so the
                # process ends with 0 and one line saying why, no traceback.
                print(e, file=sys.stderr, flush=True)
                raise SystemExit(0) from None
            state.on_reset()

    return wrapper


def run(func):
    """Decorator: runs func(state, ...) and, after a membership change,
    re-forms the job and calls it again with the restored state."""
    return run_fn(func)
