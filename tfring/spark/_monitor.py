"""The driver's end of the monitor links (the protocol: _protocol.py).

Accepts one connection per rank, relays the ranks' output to the driver's
streams, and turns each rank's last message, or its absence, into an event:
("done", rank), ("error", rank, text, traceback, secondary) or
("died", rank, how); secondary errors are tfring's reports of a failure
elsewhere (_task.py), ``how`` says how fn's process ended where the task
saw it end (None: the connection closed without a last message).

Output lines reach the driver's streams as Horovod writes a rank's output:
``[rank]<stdout>:line`` with no space after the colon, each line with the
"\n" or "\r" that ended it, and with ``prefix_output_with_timestamp``
the local time first, as ``time.asctime()`` writes it:
``Wed Dec  2 03:04:05 2026[1]<stderr>:line``.
"""

import hmac
import queue
import socket
import threading
import time

from tfring.spark._protocol import auth_token, recv_line, send_line


class Monitor:
    def __init__(self, bind_host, secret, stdout, stderr, timestamps=False):
        self._secret = secret
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._timestamps = timestamps
        self._out_lock = threading.Lock()
        self.events = queue.Queue()
        self.ranks = {}  # rank -> its hello (partition, attempt, task id, host, pid)
        self._lock = threading.Lock()
        self._conns = []
        self._closed = False
        self._sock = socket.create_server((bind_host, 0), backlog=128)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="tfring-spark-monitor",
                         daemon=True).start()

    def registered(self):
        with self._lock:
            return len(self.ranks)

    def describe(self, rank):
        """'rank R (Spark partition P, attempt A, TID T) on host H', as far as known."""
        with self._lock:
            h = self.ranks.get(rank)
        if h is None:
            return f"rank {rank}"
        return (f"rank {rank} (Spark partition {h['partition']}, attempt {h['attempt']}, "
                f"TID {h['task_id']}, stage {h['stage']}) on {h['host']} pid {h['pid']}")

    def close(self):
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="tfring-spark-rank").start()

    def _serve(self, conn):
        conn.settimeout(30.0)
        try:
            hello = recv_line(conn)
        except OSError:
            hello = None
        if not isinstance(hello, dict) or not hmac.compare_digest(
                str(hello.get("token", "")), auth_token(self._secret)):
            conn.close()  # not one of this job's tasks
            return
        rank = int(hello["rank"])
        with self._lock:
            self.ranks[rank] = hello
            self._conns.append(conn)
        try:
            send_line(conn, {"token": auth_token(self._secret, "driver")})
        except OSError:
            pass
        conn.settimeout(None)
        self.events.put(("joined", rank))
        # The last message is an event as soon as it arrives: the rank leaves
        # the tfring job after sending it, and its peers' errors about that
        # must not overtake the cause.
        ended = False
        try:
            reader = conn.makefile("rb")
            while True:
                msg = recv_line(conn, reader)
                if msg is None:
                    break
                if "out" in msg:
                    self._write(rank, msg["out"], msg.get("line", ""))
                elif "error" in msg:
                    ended = True
                    self.events.put(("error", rank, msg["error"], msg.get("traceback", ""),
                                     bool(msg.get("secondary"))))
                elif "died" in msg:
                    ended = True
                    self.events.put(("died", rank, str(msg["died"])))
                elif "done" in msg:
                    ended = True
                    self.events.put(("done", rank))
        except (OSError, ValueError):
            pass
        if not ended:
            self.events.put(("died", rank, None))

    def _write(self, rank, name, line):
        stream = self._streams.get(name)
        if stream is None:
            return
        stamp = time.asctime() if self._timestamps else ""
        if not line.endswith(("\n", "\r")):
            line += "\n"  # the last piece of fn's output: the next line starts afresh
        with self._out_lock:
            try:
                stream.write(f"{stamp}[{rank}]<{name}>:{line}")
                stream.flush()
            except (OSError, ValueError):
                pass
