"""The `process_set=` argument every collective takes (Horovod's API).

Interface, all the rest of tfring relies on:

    _process_set_arg(process_set) -> int
        The id of the set a collective runs on: 0 for the set of all ranks,
        which is what None and Horovod's `global_process_set` (id 0) mean.
        Raises NotImplementedError for any other set.

Only the set of all ranks exists here; subsets of ranks with their own
rings come with process sets proper, which replace this module.
"""

__all__ = []


def _process_set_arg(process_set):
    if process_set is None:
        return 0
    set_id = getattr(process_set, "process_set_id", None)
    if set_id == 0:
        return 0
    raise NotImplementedError(
        f"tfring: collectives run on the set of all ranks only; got "
        f"process_set={process_set!r}. Pass process_set=None (or the global "
        f"process set).")
