"""The TCP store server at job scale: one serving thread for every client.

The server runs in a child process so that its threads and fds can be
counted from /proc/<pid> without counting the test's own client threads.
Every wait has a deadline: a hang fails the test.
"""
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from tfring import _core

import wire_util

SECRET = "scale-secret"
N = 200

SERVER = (
    "import sys\n"
    "from tfring import _core\n"
    "s = _core.TcpStoreServer('127.0.0.1', 0, sys.argv[1])\n"
    "print(s.port, flush=True)\n"
    "sys.stdin.read()\n"
    "s.stop()\n"
)


@pytest.fixture
def server_proc():
    p = subprocess.Popen([sys.executable, "-c", SERVER, SECRET], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        yield p, port
    finally:
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _client(port):
    return _core.TcpStore("127.0.0.1", port, SECRET, 30.0)


def _wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_200_clients_with_blocked_waits_share_one_server_thread(server_proc):
    proc, port = server_proc
    main = _client(port)
    main.set("up", b"1")
    base_threads, base_fds = _threads(proc.pid), _fds(proc.pid)

    connected = threading.Barrier(N + 1, timeout=120)
    errors, done = [], []

    def rank(r):
        try:
            c = _client(port)
            c.set(f"rank/{r}", str(r).encode())
            c.add("arrived", 1)
            connected.wait()
            if r % 2 == 0:
                # Parked server-side until the odd neighbour sets both keys.
                c.add("parked", 1)
                c.wait([f"late/{r}", f"late/{r + 1}"], 120.0)
                vals = c.get_many([f"late/{r}", f"late/{r + 1}"], 5.0)
                assert vals == [f"{r + 1}->{r}".encode(), f"{r + 1}->{r + 1}".encode()], vals
            else:
                c.add("parked", 1)
                c.wait(["release"], 120.0)  # parked until the test releases everyone
                c.set(f"late/{r - 1}", f"{r}->{r - 1}".encode())
                c.set(f"late/{r}", f"{r}->{r}".encode())
            other = (r * 7 + 3) % N
            assert c.get(f"rank/{other}", 5.0) == str(other).encode()
            if r == 0:
                with pytest.raises(_core.TfringTimeoutError, match=r"\[never\]"):
                    c.wait(["late/0", "never"], 0.3)
            done.append((r, c.add("done", 1)))
        except BaseException as e:  # reported below, never hangs the test
            errors.append((r, repr(e)))
            connected.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(N)]
    for t in threads:
        t.start()
    try:
        connected.wait()
    except threading.BrokenBarrierError:
        pytest.fail(f"clients failed before all connected: {errors[:5]}")
    # Every client holds its connection now: the server has a socket each,
    # and still the threads it had with one client.
    assert _fds(proc.pid) >= base_fds + N
    idle_threads = _threads(proc.pid)

    # All N clients send a WAIT that cannot be answered yet.
    _wait_for(lambda: int(main.get("parked", 5.0)) == N, 60, "every client to park a WAIT")
    time.sleep(0.3)  # let the last WAITs reach the server
    parked_threads = _threads(proc.pid)
    assert not main.check(["late/0"]) and not errors, errors[:5]

    main.set("release", b"go")
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "clients hung"
    assert not errors, errors[:5]
    assert sorted(n for _, n in done) == list(range(1, N + 1))
    assert int(main.get("arrived", 1.0)) == N

    assert idle_threads <= base_threads + 1, (base_threads, idle_threads)
    assert parked_threads <= base_threads + 1, (base_threads, parked_threads)


def _frame(payload):
    return struct.pack("<I", len(payload)) + payload


def test_parked_waits_of_vanished_clients_are_dropped(server_proc):
    proc, port = server_proc
    main = _client(port)
    main.set("up", b"1")
    base_fds = _fds(proc.pid)
    socks = []
    for i in range(50):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert wire_util.handshake(s, SECRET)
        key = f"never/{i}".encode()
        # WAIT u32 n, n strings, i64 timeout_us (csrc/rendezvous/tcp_store.cc)
        s.sendall(_frame(b"\x05" + struct.pack("<I", 1) + struct.pack("<I", len(key)) + key
                         + struct.pack("<q", 600_000_000)))
        socks.append(s)
    _wait_for(lambda: _fds(proc.pid) >= base_fds + 50, 10, "the raw clients to connect")
    for s in socks:
        s.close()
    # The server notices each parked client leave and closes its socket,
    # without waiting for the ten-minute deadline they sent.
    _wait_for(lambda: _fds(proc.pid) <= base_fds, 10, "the server to drop the parked WAITs")
    main.set("never/3", b"late")  # wakes nobody: the waiter is gone
    assert main.get("never/3", 1.0) == b"late"


def test_large_values_reach_many_readers_at_once(server_proc):
    # Replies larger than a socket buffer go out in pieces as each reader's
    # socket drains; readers blocked in GET get the whole value once it is set.
    _, port = server_proc
    value = os.urandom(8 << 20)
    got, errors = {}, []

    def reader(i):
        try:
            got[i] = _client(port).get("big", 60.0)
        except BaseException as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    _client(port).set("big", value)
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(got) == 16 and all(v == value for v in got.values())
