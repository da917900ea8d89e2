"""Rendezvous stores: TcpStore (server + clients), FileStore, PrefixStore.

Every wait in these tests has a short timeout and every process join a
deadline: a hang is a bug, so it must fail the test rather than stall it.
"""
import multiprocessing as mp
import socket
import struct
import threading
import time

import pytest

from tfring import _core

import wire_util

SECRET = "test-secret"


@pytest.fixture
def server():
    srv = _core.TcpStoreServer("127.0.0.1", 0, SECRET)
    yield srv
    srv.stop()


def _tcp(server, timeout=5.0):
    return _core.TcpStore("127.0.0.1", server.port, SECRET, timeout)


@pytest.fixture(params=["tcp", "file", "prefix"])
def store(request, tmp_path):
    if request.param == "file":
        yield _core.FileStore(str(tmp_path / "store"))
        return
    srv = _core.TcpStoreServer("127.0.0.1", 0, SECRET)
    client = _tcp(srv)
    yield _core.PrefixStore("job1", client) if request.param == "prefix" else client
    srv.stop()


# ---------------------------------------------------------------- basics ----

def test_set_get_roundtrip(store):
    store.set("plain", b"value")
    store.set("with/slash:colon..", b"\x00\xffbinary")
    store.set("empty", b"")
    assert store.get("plain") == b"value"
    assert store.get("with/slash:colon..", timeout=1.0) == b"\x00\xffbinary"
    assert store.get("empty") == b""
    store.set("plain", b"overwritten")
    assert store.get("plain") == b"overwritten"
    assert isinstance(store, _core.Store)


def test_add_counts_and_is_readable(store):
    assert store.add("ctr", 1) == 1
    assert store.add("ctr", 5) == 6
    assert store.add("ctr", -2) == 4
    assert store.add("fresh", 0) == 0
    assert store.get("ctr") == b"4"


def test_add_on_non_integer_value_is_rejected(store):
    store.set("text", b"hello")
    with pytest.raises(_core.TfringError, match=r"text.*not an integer"):
        store.add("text", 1)


def test_check_and_wait(store):
    assert store.check([])
    assert not store.check(["a"])
    store.set("a", b"1")
    assert store.check(["a"])
    assert not store.check(["a", "b"])
    store.set("b", b"2")
    store.wait(["a", "b"], timeout=1.0)
    assert store.check(["a", "b"])


def test_get_blocks_until_another_thread_sets(store):
    # The setter uses the same store object: a blocked get() must not hold up
    # other threads' calls (TcpStore opens a second connection for them).
    timer = threading.Timer(0.2, store.set, args=("late", b"here"))
    timer.start()
    try:
        start = time.monotonic()
        # Needs the GIL released while blocked, or the timer could not run.
        assert store.get("late", timeout=5.0) == b"here"
        assert time.monotonic() - start < 4.0
    finally:
        timer.join(5)


def test_get_timeout_names_key(store):
    start = time.monotonic()
    with pytest.raises(_core.TfringTimeoutError, match=r"timed out after 0\.3 s.*\[(job1/)?missing/key\]"):
        store.get("missing/key", timeout=0.3)
    assert 0.25 < time.monotonic() - start < 3.0


def test_wait_timeout_names_only_missing_keys(store):
    store.set("present", b"x")
    with pytest.raises(_core.TfringTimeoutError) as info:
        store.wait(["present", "absent1", "absent2"], timeout=0.3)
    msg = str(info.value)
    assert "absent1, " in msg and "absent2]" in msg and "present" not in msg
    # The hierarchy lets callers catch broadly or by kind.
    assert isinstance(info.value, _core.TfringError)
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, TimeoutError)


def test_get_many_waits_for_every_key_and_keeps_order(store):
    store.set("m/2", b"two")
    timer = threading.Timer(0.2, store.set, args=("m/0", b"zero"))
    timer.start()
    try:
        assert store.get_many(["m/2", "m/0", "m/2"], timeout=5.0) == [b"two", b"zero", b"two"]
    finally:
        timer.join(5)
    assert store.get_many([], timeout=1.0) == []
    with pytest.raises(_core.TfringTimeoutError) as info:
        store.get_many(["m/0", "m/absent"], timeout=0.3)
    assert "m/absent]" in str(info.value) and "m/0" not in str(info.value)


# ------------------------------------------------------------------- tcp ----

def test_tcp_timeout_message_names_address(server):
    with pytest.raises(_core.TfringTimeoutError,
                       match=rf"waiting for store keys \[k1\] at 127\.0\.0\.1:{server.port}"):
        _tcp(server).wait(["k1"], timeout=0.2)


def test_tcp_clients_share_keys(server):
    a, b = _tcp(server), _tcp(server)
    a.set("shared", b"from-a")
    assert b.get("shared", timeout=1.0) == b"from-a"
    assert a.add("n", 2) == 2 and b.add("n", 3) == 5


def test_tcp_client_is_thread_safe(server):
    client = _tcp(server)

    def hammer():
        for _ in range(50):
            client.add("hits", 1)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert client.get("hits") == b"400"


def test_wrong_secret_is_rejected(server):
    with pytest.raises(_core.MismatchError, match="rejected this process: wrong job secret"):
        _core.TcpStore("127.0.0.1", server.port, "not-the-secret", 2.0)
    # The server keeps serving authenticated clients afterwards.
    good = _tcp(server)
    good.set("k", b"v")
    assert good.get("k") == b"v"


def test_connect_to_dead_port_times_out():
    with socket.socket() as s:  # find a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(_core.TfringTimeoutError) as info:
        _core.TcpStore("127.0.0.1", port, SECRET, 0.5)
    elapsed = time.monotonic() - start
    msg = str(info.value)
    assert f"could not connect to the tfring store at 127.0.0.1:{port}" in msg
    assert "is rank 0 running?" in msg
    assert 0.4 < elapsed < 3.0


def test_client_connects_before_server_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder = {}
    starter = threading.Timer(
        0.3, lambda: holder.setdefault("srv", _core.TcpStoreServer("127.0.0.1", port, SECRET)))
    starter.start()
    try:
        client = _core.TcpStore("127.0.0.1", port, SECRET, 5.0)  # retries refused connects
        client.set("up", b"1")
        assert client.get("up") == b"1"
    finally:
        starter.join(5)
        if "srv" in holder:
            holder["srv"].stop()


def _frame(payload):
    return struct.pack("<I", len(payload)) + payload


def _string(b):
    return struct.pack("<I", len(b)) + b


def test_server_survives_abrupt_and_garbage_clients(server):
    # Half-sent frames, oversized frames, garbage and unauthenticated peers
    # end only their own connection.
    for payload in [b"", b"\x05\x00", b"\xff\xff\xff\xff", b"\x10\x00\x00\x00\x01garbage"]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as raw:
            raw.sendall(payload)
    # An authenticated client that vanishes while its GET blocks server-side
    # (wire format: see csrc/rendezvous/tcp_store.cc).
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as raw:
        assert wire_util.handshake(raw, SECRET)
        raw.sendall(_frame(b"\x03" + _string(b"never") + struct.pack("<q", 10_000_000)))
    client = _tcp(server)
    client.set("alive", b"yes")
    assert _tcp(server).get("alive") == b"yes"


def test_stop_unblocks_waiting_clients():
    srv = _core.TcpStoreServer("127.0.0.1", 0, SECRET)
    client = _tcp(srv)
    errors = []

    def blocked():
        try:
            client.get("never", timeout=20.0)
        except _core.TfringError as e:
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    start = time.monotonic()
    srv.stop()
    t.join(5)
    assert not t.is_alive(), "stop() did not unblock a waiting get()"
    assert time.monotonic() - start < 3.0
    assert errors and isinstance(errors[0], _core.PeerFailureError)
    assert "tfring store at 127.0.0.1" in str(errors[0])
    # A broken connection stays broken with a clear message, never hangs.
    with pytest.raises(_core.PeerFailureError):
        client.set("k", b"v")
    srv.stop()  # idempotent


# ------------------------------------------------------------------ file ----

def test_file_store_shares_through_directory(tmp_path):
    a = _core.FileStore(str(tmp_path / "nested" / "dir"))
    b = _core.FileStore(str(tmp_path / "nested" / "dir") + "/")
    a.set("rank/0:addr", b"10.0.0.1")
    assert b.get("rank/0:addr", timeout=1.0) == b"10.0.0.1"
    assert b.check(["rank/0:addr"]) and not b.check(["rank/1:addr"])
    # Encoded names stay inside the directory, and no temporary files remain.
    names = sorted(p.name for p in (tmp_path / "nested" / "dir").iterdir())
    assert names == ["k_rank%2F0%3Aaddr"]
    long_key = "x" * 1000
    a.set(long_key, b"long")
    assert b.get(long_key) == b"long"
    with pytest.raises(_core.TfringTimeoutError, match=r"\[nope\] in the file store at"):
        b.get("nope", timeout=0.1)


# ---------------------------------------------------------- multiprocess ----

NPROCS = 4


def _worker(kind, where, rank, results):
    try:
        if kind == "tcp":
            store = _core.TcpStore("127.0.0.1", where, SECRET, 10.0)
        else:
            store = _core.FileStore(where)
        arrived = store.add("arrived", 1)
        store.set(f"rank/{rank}", str(rank).encode())
        store.wait([f"rank/{r}" for r in range(NPROCS)], 10.0)
        values = [store.get(f"rank/{r}", 1.0) for r in range(NPROCS)]
        assert values == [str(r).encode() for r in range(NPROCS)]
        # A barrier built on add(): everyone has arrived once this returns.
        store.add("done", 1)
        while int(store.get("done", 10.0)) < NPROCS:
            time.sleep(0.005)
        results.put((rank, arrived, int(store.get("arrived", 1.0))))
    except BaseException as e:  # report, never hang the parent
        results.put((rank, "error", repr(e)))


def _run_workers(kind, where):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, where, r, results)) for r in range(NPROCS)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 30
        got = []
        while len(got) < NPROCS and time.monotonic() < deadline:
            try:
                got.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:
                break
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        hung = [p.pid for p in procs if p.is_alive()]
        assert not hung, f"worker processes hung: {hung}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [g for g in got if g[1] == "error"]
    assert not errors, errors
    assert len(got) == NPROCS, f"only {len(got)} of {NPROCS} workers reported: {got}"
    # Each add() saw a distinct count, and all of them were seen at the end.
    assert sorted(g[1] for g in got) == list(range(1, NPROCS + 1))
    assert all(g[2] == NPROCS for g in got)
    assert all(p.exitcode == 0 for p in procs)


def test_multiprocess_tcp_store(server):
    _run_workers("tcp", server.port)


def test_multiprocess_file_store(tmp_path):
    _run_workers("file", str(tmp_path / "shared"))
