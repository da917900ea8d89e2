"""Horovod's horovod.runner.util.threads.in_thread, which Horovod's
test/utils/common.py imports at module level."""

import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Runs target(*args) in a background thread and returns the thread."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, "
                         "for a single argument use (arg,)")
    fn = target
    if silent:
        def fn(*a):
            try:
                target(*a)
            except Exception:  # noqa: BLE001 - silent means silent
                pass
    thread = threading.Thread(target=fn, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
