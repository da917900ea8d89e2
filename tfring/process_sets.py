"""Process sets: collectives over a subset of the ranks, as in Horovod.

    even = tfring.ProcessSet([0, 2])
    tfring.init(process_sets=[even])          # static: created at init
    odd = tfring.add_process_set([1, 3])      # dynamic: any time after init
    if even.included():
        y = tfring.allreduce(x, process_set=even)
    tfring.remove_process_set(odd)

Each set is a communicator of its own in the core (csrc/runtime/
registry.h): its own ring over its members, in the order of their global
ranks, its own negotiation, cache and fusion. The core holds the sets and
gives out their ids; this module only keeps the ProcessSet object it handed
out for each id, so the same object comes back from `process_set_by_id`.
Collectives on two disjoint sets run at the same time; a set never waits
for ranks outside it.

Creating and removing a set are collective over every rank of the job,
called in the same order with the same ranks (checked: a rank that differs
gets an error naming it, on every rank). Horovod needs
HOROVOD_DYNAMIC_PROCESS_SETS=1 before `add_process_set` after init; here it
always works, and that variable (or TFRING_DYNAMIC_PROCESS_SETS) changes
nothing.
"""

import numpy as np

from tfring import _core

__all__ = [
    "ProcessSet", "add_process_set", "global_process_set", "process_set_by_id",
    "process_sets", "remove_process_set",
]

# Name of the world collective that checks every rank makes the same change.
_AGREE_NAME = "tfring.process_sets.change"
_ADD, _REMOVE = 1, 2


class ProcessSet:
    """A set of ranks that run collectives together. Give it the global
    ranks (any order, no repeats; they are kept sorted, which is the order
    of the set's ring and of allgather results), then pass it to
    `tfring.init(process_sets=[...])` or `tfring.add_process_set`.
    `process_set_id` is set once it is registered (0: the global set)."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if _is_mpi_comm(ranks_or_comm):
            raise NotImplementedError(
                "tfring: a ProcessSet from an MPI communicator is not supported; "
                "give the list of its global ranks instead")
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError(
                f"tfring: ProcessSet takes a list of ranks, got {ranks_or_comm!r}") from None
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                raise ValueError(f"tfring: ProcessSet ranks must be integers, got {r!r} "
                                 f"in {ranks!r}")
        ranks = sorted(int(r) for r in ranks)
        repeated = sorted({r for i, r in enumerate(ranks) if i and ranks[i - 1] == r})
        if repeated:
            raise ValueError(f"tfring: ProcessSet({ranks}) repeats rank(s) {repeated}")
        self.ranks = ranks

    def _registered(self):
        return self.process_set_id is not None and _core.is_initialized()

    def size(self):
        """Number of ranks in the set; None until it is registered."""
        return len(self.ranks) if self._registered() else None

    def rank(self):
        """This process's rank within the set (its index in `ranks`), -1
        if it is not a member; None until the set is registered."""
        if not self._registered():
            return None
        me = _core.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        """Whether this process is a member; None until registered."""
        if not self._registered():
            return None
        return _core.rank() in self.ranks

    def invalidate(self):
        self.process_set_id = None
        self.ranks = None

    def __eq__(self, other):
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return self.ranks == other.ranks and self.process_set_id == other.process_set_id

    def __hash__(self):
        return hash((tuple(self.ranks or ()), self.process_set_id))

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


def _is_mpi_comm(obj):
    cls = type(obj)
    return cls.__module__.startswith("mpi4py") and "Comm" in cls.__name__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# id -> the ProcessSet object handed out for a set the core holds.
_objects = {0: global_process_set}


def _label(ps_id, ranks):
    if ps_id == 0:
        return f"the global process set (id 0, ranks {list(ranks)})"
    return f"process set {ps_id} (ranks {list(ranks)})"


def _setup():
    """Called by tfring.init once the core is up: only the global set."""
    _reset()
    global_process_set.ranks = list(range(_core.size()))


def _reset():
    """Called at shutdown: every set but the global one is gone."""
    for ps_id in [i for i in _objects if i != 0]:
        _objects.pop(ps_id).invalidate()


def _live_ids():
    """The sets the core holds, the global one first."""
    return [0, *_core.process_set_ids()] if _core.is_initialized() else [0]


def _object(ps_id):
    """The ProcessSet for a set the core holds (made on first use)."""
    ps = _objects.get(ps_id)
    if ps is None:
        ps = ProcessSet(_core.process_set_ranks(ps_id))
        ps.process_set_id = ps_id
        _objects[ps_id] = ps
    return ps


def _require_init(what):
    if not _core.is_initialized():
        raise ValueError(f"tfring: {what} needs tfring.init() first")


def _agree(kind, ps_id, ranks):
    """Every rank's (kind, id, ranks) goes round the world; each rank checks
    they all match, so a rank that differs fails everywhere, named."""
    mine = np.array([kind, ps_id, len(ranks), *ranks], dtype=np.int64)
    if _core.size() == 1:
        return
    flat = _core.allgather(mine, name=_AGREE_NAME)
    seen, i = [], 0
    while i < len(flat):
        k, sid, n = (int(v) for v in flat[i:i + 3])
        seen.append((k, sid, [int(v) for v in flat[i + 3:i + 3 + n]]))
        i += 3 + n
    want = (kind, ps_id, list(ranks))
    bad = [r for r, s in enumerate(seen) if s != want]
    if bad:
        def say(s):
            verb = "adding" if s[0] == _ADD else "removing"
            return f"{verb} {_label(s[1], s[2])}"
        detail = "; ".join(f"rank {r} is {say(seen[r])}" for r in range(len(seen)))
        raise ValueError(
            "tfring: ranks disagree on a process set change (every rank must add and "
            f"remove the same sets in the same order): {detail}")


def add_process_set(process_set):
    """Creates a process set on every rank (collective: every rank calls it
    with the same ranks, in the same order relative to other adds and
    removes). Takes a ProcessSet or a list of ranks; returns the
    registered ProcessSet. Members connect the set's ring before this
    returns."""
    _require_init("add_process_set")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"tfring: {process_set} has already been added")
    ranks = process_set.ranks
    size = _core.size()
    if not ranks:
        raise ValueError("tfring: a process set needs at least one rank")
    outside = [r for r in ranks if r < 0 or r >= size]
    if outside:
        raise ValueError(f"tfring: ProcessSet({ranks}): rank(s) {outside} are not in "
                         f"[0, {size}) (the job has {size} ranks)")
    for ps_id in _live_ids():
        if _ranks_of(ps_id) == ranks:
            raise ValueError(f"tfring: ProcessSet({ranks}) already exists as "
                             f"{_label(ps_id, ranks)}")
    ps_id = _core.next_process_set_id()
    _agree(_ADD, ps_id, ranks)
    _core.add_process_set(ps_id, ranks)
    process_set.process_set_id = ps_id
    _objects[ps_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Removes a process set on every rank (collective, like adding one),
    after every rank has finished its collectives on it. Returns False for
    the global set, which cannot be removed, else True. Every ProcessSet
    object registered under that id is invalidated."""
    _require_init("remove_process_set")
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"tfring: remove_process_set takes a ProcessSet, got {process_set!r}")
    ps_id = process_set.process_set_id
    if ps_id is None:
        raise ValueError(f"tfring: {process_set} is not registered (never added, or "
                         "already removed)")
    if ps_id == 0:
        return False
    ranks = _ranks_of(ps_id)
    if not ranks:
        raise ValueError(f"tfring: process set {ps_id} does not exist")
    _agree(_REMOVE, ps_id, ranks)
    ps = _objects.pop(ps_id, None)
    if ps is not None:
        ps.invalidate()
    process_set.invalidate()
    _core.remove_process_set(ps_id)
    return True


def _ranks_of(ps_id):
    """The set's global ranks as the core holds them ([] if it holds none)."""
    if ps_id == 0:
        return list(range(_core.size())) if _core.is_initialized() else []
    return list(_core.process_set_ranks(ps_id)) if _core.is_initialized() else []


def process_set_by_id(process_set_id):
    """The registered ProcessSet with this id."""
    if process_set_id not in _live_ids():
        raise ValueError(f"tfring: no process set with id {process_set_id}")
    return _object(process_set_id)


def process_sets():
    """Every registered process set, by id (the global one first)."""
    return [_object(i) for i in _live_ids()]


def _process_set_arg(process_set):
    """The core's id for a `process_set=` argument (None or the global set:
    0), after checking the set is registered and this rank is in it; the
    error names the set and the rank."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"tfring: process_set must be a tfring.ProcessSet, got "
                         f"{process_set!r}")
    ps_id = process_set.process_set_id
    if ps_id == 0:
        return 0
    if ps_id is None or not _ranks_of(ps_id):
        raise ValueError(
            f"tfring: {process_set} is not registered: add it with "
            "tfring.add_process_set or tfring.init(process_sets=[...]); a removed set "
            "cannot be used")
    _require_init("a collective on a process set")
    me = _core.rank()
    if me not in process_set.ranks:
        raise ValueError(f"tfring: rank {me} is not in {_label(ps_id, process_set.ranks)}, "
                         "so it cannot take part in its collectives")
    return ps_id


def _rank_size(ps_id):
    """This rank's index in the set and the set's size (the world's for 0)."""
    if ps_id == 0:
        return _core.rank(), _core.size()
    ranks = _ranks_of(ps_id)
    return ranks.index(_core.rank()), len(ranks)
