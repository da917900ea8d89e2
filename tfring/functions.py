"""Object collectives (Horovod's allgather_object, broadcast_object,
broadcast_object_fn): any picklable Python object, pickled (cloudpickle when
installed, so lambdas and local classes travel too, else pickle) into a
uint8 array and moved with the core's collectives.

Protocol. broadcast: the root's pickle length goes first (an int64
broadcast), so the other ranks can size their buffer, then the bytes.
allgather: every rank's length, then the bytes; the first dimension of an
allgather may differ by rank, so ranks with pickles of different sizes need
no padding. The collectives are the native ones, not TF ops: they work the
same in eager mode, inside tf.compat.v1 graphs (no session needed; Horovod's
`session` argument is accepted and unused) and before any TF op runs.

Names. Ranks match the two collectives by name: `name` (default
"allgather_object" / "broadcast_object") plus ".sz" and ".t". Horovod's
default is the object's type name, which differs between a root holding a
dict and ranks passing None; a fixed default never does.
"""

import io
import pickle

import numpy as np

from tfring import _core, basics
from tfring.process_sets import _process_set_arg, _rank_size

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle

__all__ = ["allgather_object", "broadcast_object", "broadcast_object_fn"]


def _dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return np.frombuffer(buf.getvalue(), np.uint8)


def _loads(arr):
    return pickle.loads(np.ascontiguousarray(arr, np.uint8).tobytes())


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=None):
    """Returns `root_rank`'s `obj` on every rank (other ranks' `obj` is
    ignored; None will do)."""
    basics._require()
    ps_id = _process_set_arg(process_set)
    name = name or "broadcast_object"
    root_rank = int(root_rank)
    is_root = basics.rank() == root_rank
    data = _dumps(obj) if is_root else None
    n = np.array([data.size if is_root else 0], np.int64)
    # The core checks the root (in the job, in the set) on every rank's
    # behalf: a root that is wrong on one rank fails every rank alike.
    try:
        n = _core.broadcast(n, root=root_rank, name=f"{name}.sz", process_set=ps_id)
    except _core.InvalidArgumentError as e:
        raise ValueError(f"tfring: broadcast_object {name!r} with root_rank "
                         f"{root_rank}: {e}") from e
    if not is_root:
        data = np.zeros(int(n[0]), np.uint8)
    data = _core.broadcast(data, root=root_rank, name=f"{name}.t",
                           process_set=ps_id)
    return obj if is_root else _loads(data)


def broadcast_object_fn(root_rank=0, session=None, name=None,
                        process_set=None):
    """Returns a function f(obj) that does broadcast_object(obj, root_rank)
    (Horovod builds its graph once for TF1 sessions; here nothing needs
    building)."""
    name = name or "broadcast_object_fn"

    def _bcast(obj):
        return broadcast_object(obj, root_rank, name=name,
                                process_set=process_set)
    return _bcast


def allgather_object(obj, session=None, name=None, process_set=None):
    """Returns the list of every rank's `obj`, in rank order."""
    basics._require()
    ps_id = _process_set_arg(process_set)
    name = name or "allgather_object"
    data = _dumps(obj)
    sizes = _core.allgather(np.array([data.size], np.int64), name=f"{name}.sz",
                            process_set=ps_id)
    gathered = _core.allgather(data, name=f"{name}.t", process_set=ps_id)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [_loads(gathered[offsets[r]:offsets[r + 1]])
            for r in range(_rank_size(ps_id)[1])]
