"""The monitor link between tfring.spark's driver and its tasks.

One TCP connection per rank, opened by the task once it knows its rank and
kept open while ``fn`` runs. Every message is one line of JSON:

  task -> driver  {"token", "rank", "partition", "attempt", "task_id",
                   "stage", "host", "pid"}       first: who this is
  driver -> task  {"token"}                      the driver's answer
  task -> driver  {"out": "stdout"|"stderr", "line"}   fn's output, a line each
  task -> driver  {"error", "traceback", "secondary"}  fn raised (last message)
  task -> driver  {"died": "how"}                fn's process ended without a
                                                 result (last message; ``run``
                                                 with ``executable`` only)
  task -> driver  {"done": true}                 fn returned (last message)

A "line" keeps the character that ended it, "\n" or "\r" (a progress bar
redraws its line with "\r"), as Horovod forwards a rank's output; the last
piece of output, if unterminated, comes without one.

The connection ending without a last message means the task's Python
worker died (killed, os._exit, a crash): the kernel closes its sockets, so
the driver hears of it at once. Tokens are HMACs of the job's secret, so
neither side takes a stranger for the other.
"""

import hashlib
import hmac
import json
import sys

MAX_LINE = 1 << 20  # a longer line (a huge traceback) is cut, not refused


def auth_token(secret, role="task"):
    return hmac.new(secret.encode(), f"tfring.spark:{role}".encode(),
                    hashlib.sha256).hexdigest()


def send_line(conn, msg, lock=None):
    data = (json.dumps(msg) + "\n").encode()
    if lock is None:
        conn.sendall(data)
    else:
        with lock:
            conn.sendall(data)


def recv_line(conn, reader=None):
    """One message from ``conn`` (or from ``reader``, a file made from it);
    None at the end of the stream."""
    if reader is None:
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                return None
            buf += chunk
            if len(buf) > MAX_LINE:
                return None
        line = bytes(buf)
    else:
        line = reader.readline(MAX_LINE)
        if not line:
            return None
    try:
        return json.loads(line)
    except ValueError:
        return None


def is_secondary(e):
    """Whether ``e`` is how tfring tells a rank that the job failed elsewhere:
    a core error (a peer died, shut down or timed out) or the TensorFlow op
    error that carries one. The driver names a rank whose error is not,
    or a rank that died, before these."""
    from tfring import _core

    if isinstance(e, _core.TfringError):
        return True
    tf = sys.modules.get("tensorflow")
    errors = getattr(tf, "errors", None) if tf is not None else None
    return errors is not None and isinstance(e, errors.OpError)
