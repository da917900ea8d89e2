"""Reads a TensorFlow profiler trace (the .xplane.pb that
tf.profiler.experimental.start/stop writes) and says where a training
step's time went on the host: how long TensorFlow's op threads were busy
and how long they sat idle, waiting for an asynchronous op (a collective)
or for Python."""

import glob
import os


def _events(logdir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                             recursive=True))
    if not paths:
        raise FileNotFoundError(f"no .xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            for e in line.events:
                start_us = (line.timestamp_ns * 1000 + e.offset_ps) / 1e6
                yield (start_us, e.duration_ps / 1e6, names[e.metadata_id].name,
                       line.name)


def _union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def op_thread_breakdown(logdir, steps):
    """Per step, in ms: `window` (the profiled time), `busy` (some TF op
    thread runs an op), `idle` (window - busy: no op runs, the step waits
    on an asynchronous op or on Python), `op_cpu` (summed over op threads)
    and `ops` (op executions)."""
    ops, first, last = [], None, None
    for start, dur, name, line in _events(logdir):
        first = start if first is None else min(first, start)
        last = start + dur if last is None else max(last, start + dur)
        # Op executions: "<node name>:<op type>" on the op threads.
        if line.startswith("tf_") and ":" in name and "::" not in name:
            ops.append((start, start + dur))
    if not ops:
        raise ValueError(f"no op executions in the trace under {logdir}")
    # The window: from the first op to the last (the profiler's own start
    # and stop are left out).
    lo, hi = min(a for a, _ in ops), max(b for _, b in ops)
    busy = _union(ops)
    cpu = sum(b - a for a, b in ops)
    ms = 1e3 * steps
    return {"window": (hi - lo) / ms, "busy": busy / ms,
            "idle": (hi - lo - busy) / ms, "op_cpu": cpu / ms,
            "ops": len(ops) / steps}
