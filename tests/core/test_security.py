"""Security of tfring's connections: the SHA-256/HMAC under the handshake
(against FIPS 180-4 / RFC 4231 vectors), the mutual
challenge-response (against the standard-library reference in
wire_util.py), hostile bytes on every parser and listening port, where
listening sockets bind, and `tfring.keras` reachable as an attribute.

Every wait has a deadline. The hypothesis-driven fuzzing is in
test_security_fuzz.py."""

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from tfring import _core, _core_testing

import wire_util
from wire_util import PURPOSE_CONTROL, PURPOSE_RING, PURPOSE_STORE, frame

SECRET = "security-test-secret"
WORKERS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "workers"))


# ------------------------------------------------------------ SHA / HMAC ----

@pytest.mark.parametrize("msg, hexdigest", [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
])
def test_sha256_fips_vectors(msg, hexdigest):
    assert _core_testing.sha256(msg).hex() == hexdigest


@pytest.mark.parametrize("key, msg, hexdigest", [
    (b"\x0b" * 20, b"Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50,
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger "
     b"than block-size data. The key needs to be hashed before being used by the "
     b"HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
])
def test_hmac_rfc4231_vectors(key, msg, hexdigest):
    assert _core_testing.hmac_sha256(key, msg).hex() == hexdigest


def test_random_bytes_differ():
    a, b = _core_testing.random_bytes(32), _core_testing.random_bytes(32)
    assert len(a) == len(b) == 32 and a != b


# ------------------------------------------------------------- handshake ----

@pytest.fixture(scope="module")
def server():
    srv = _core.TcpStoreServer("127.0.0.1", 0, SECRET)
    yield srv
    srv.stop()


def _client(srv):
    return _core.TcpStore("127.0.0.1", srv.port, SECRET, 5.0)


def _raw(srv, timeout=5.0):
    return socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)


def test_reference_client_is_accepted_and_server_proves_the_secret(server):
    with _raw(server) as s:
        assert wire_util.handshake(s, SECRET)


def test_wrong_secret_rejected_on_both_sides(server):
    with _raw(server) as s:
        assert not wire_util.handshake(s, "not-the-secret")
    with pytest.raises(_core.MismatchError,
                       match=f"store at 127.0.0.1:{server.port} rejected this process: "
                             "wrong job secret"):
        _core.TcpStore("127.0.0.1", server.port, "not-the-secret", 2.0)


def test_connection_for_another_purpose_is_refused(server):
    with _raw(server) as s:
        s.sendall(wire_util.client_hello(PURPOSE_RING, 0, os.urandom(32)))
        m2 = wire_util.recv_frame(s)
        assert struct.unpack("<IBB", m2[:6]) == (wire_util.MAGIC, wire_util.VERSION, 2)


def test_old_protocol_version_gets_a_version_answer(server):
    with _raw(server) as s:
        s.sendall(wire_util.client_hello(PURPOSE_STORE, -1, os.urandom(32), version=2))
        m2 = wire_util.recv_frame(s)
        # status 1: version mismatch, with the version the server speaks
        assert struct.unpack("<IBB", m2[:6]) == (wire_util.MAGIC, wire_util.VERSION, 1)


class FakeServer:
    """Accepts one connection and runs `script(sock)` on it in a thread."""

    def __init__(self, script):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        self.seen = {}
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script):
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(20)
            try:
                script(conn, self.seen)
            except (OSError, EOFError) as e:
                self.seen["error"] = repr(e)

    def close(self):
        self.thread.join(30)
        self.listener.close()


def test_secret_never_on_the_wire_and_client_proof_matches_reference():
    nonce_s = os.urandom(32)

    def script(conn, seen):
        m1 = wire_util.recv_frame(conn)
        seen["m1"] = m1
        conn.sendall(frame(struct.pack("<IBB", wire_util.MAGIC, wire_util.VERSION, 0) + nonce_s))
        seen["m3"] = wire_util.recv_frame(conn)
        conn.sendall(frame(b"\x00"))  # reject: the client must raise

    fake = FakeServer(script)
    with pytest.raises(_core.MismatchError, match="rejected this process: wrong job secret"):
        _core.TcpStore("127.0.0.1", fake.port, SECRET, 5.0)
    fake.close()
    m1, m3 = fake.seen["m1"], fake.seen["m3"]
    magic, version, purpose, rank = struct.unpack("<IBIi", m1[:13])
    assert (magic, version, purpose, rank) == (
        wire_util.MAGIC, wire_util.VERSION, PURPOSE_STORE, -1)
    nonce_c = m1[13:]
    assert m3 == wire_util.proof(SECRET, b"tfring client", nonce_s, nonce_c, PURPOSE_STORE, -1)
    assert SECRET.encode() not in m1 + m3


def test_server_that_cannot_prove_the_secret_is_refused():
    def script(conn, seen):
        wire_util.recv_frame(conn)
        conn.sendall(frame(struct.pack("<IBB", wire_util.MAGIC, wire_util.VERSION, 0)
                           + os.urandom(32)))
        wire_util.recv_frame(conn)
        conn.sendall(frame(b"\x01" + os.urandom(32)))  # "accepted", with a forged proof

    fake = FakeServer(script)
    with pytest.raises(_core.MismatchError, match="could not prove it knows the job secret"):
        _core.TcpStore("127.0.0.1", fake.port, SECRET, 5.0)
    fake.close()


def test_server_of_another_version_is_reported_as_such():
    def script(conn, seen):
        wire_util.recv_frame(conn)
        conn.sendall(frame(struct.pack("<IBB", wire_util.MAGIC, 9, 1) + os.urandom(32)))

    fake = FakeServer(script)
    with pytest.raises(_core.MismatchError, match="protocol version 9 but this build speaks"):
        _core.TcpStore("127.0.0.1", fake.port, SECRET, 5.0)
    fake.close()


def test_silent_server_times_out(monkeypatch):
    # The client gives the handshake TFRING_HANDSHAKE_TIMEOUT (default 10 s),
    # or its connect timeout where that is longer: 1.5 s here, neither the
    # 0.2 s connect timeout nor the default.
    monkeypatch.setenv("TFRING_HANDSHAKE_TIMEOUT", "1.5")

    def script(conn, seen):
        conn.recv(1024)
        conn.recv(1)  # never answers; returns once the client gives up

    fake = FakeServer(script)
    start = time.monotonic()
    with pytest.raises(_core.TfringTimeoutError, match="timed out receiving"):
        _core.TcpStore("127.0.0.1", fake.port, SECRET, 0.2)
    elapsed = time.monotonic() - start
    fake.close()
    assert 1.4 <= elapsed < 8, elapsed


@pytest.mark.parametrize("value, match", [
    ("soon", "is not a number of seconds"),
    ("0", r"is out of range \(at least 0.001\)"),
    ("-1", r"is out of range \(at least 0.001\)"),
])
def test_bad_handshake_timeout_is_refused_naming_the_variable(server, monkeypatch, value, match):
    monkeypatch.setenv("TFRING_HANDSHAKE_TIMEOUT", value)
    full = f"TFRING_HANDSHAKE_TIMEOUT={value} {match}"
    with pytest.raises(_core.InvalidArgumentError, match=full):
        _core.TcpStoreServer("127.0.0.1", 0, SECRET)
    with pytest.raises(_core.InvalidArgumentError, match=full):
        _core.TcpStore("127.0.0.1", server.port, SECRET, 2.0)


# ---------------------------------------------------------- fuzz parsers ----

def _meta(name=b"w", shape=(2, 3)):
    return (struct.pack("<I", len(name)) + name + bytes([0, 2]) +
            struct.pack("<I", len(shape)) + b"".join(struct.pack("<q", d) for d in shape) +
            bytes([0]) + struct.pack("<i", 0) + struct.pack("<dd", 1.0, 1.0) +
            struct.pack("<i", -1) + bytes([0]) +  # device, wire (none)
            struct.pack("<I", 0) +  # no alltoall splits
            struct.pack("<I", 0))  # valid: no error of its own


def _response():
    name = b"grad"
    group = (bytes([0, 0]) + struct.pack("<I", 1) + struct.pack("<I", len(name)) + name +
             struct.pack("<I", 1) + struct.pack("<I", 2) + struct.pack("<qq", 3, 4) +
             struct.pack("<I", 0) + struct.pack("<I", 0))  # no error, no join fill
    return (struct.pack("<Q", 7) + struct.pack("<I", 1) + struct.pack("<i", 0) +
            struct.pack("<I", len(name)) + name + struct.pack("<I", 1) + group)


def _store_request():
    key, value = b"key", b"value"
    return bytes([2]) + struct.pack("<I", 3) + key + struct.pack("<I", 5) + value


VALID = {
    "hello": wire_util.client_hello(PURPOSE_CONTROL, 3, b"n" * 32)[4:],
    "meta": _meta(),
    "response": _response(),
    "store": _store_request(),
    "frame": frame(b"payload"),
}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_parsers_accept_valid_input(kind):
    _core_testing.fuzz_parse(kind, VALID[kind])  # the fuzz tests below start from these


@pytest.mark.parametrize("kind, data, match", [
    ("response", struct.pack("<QI", 1, 0) + struct.pack("<I", 0xFFFFFFFF), "count"),
    ("response", struct.pack("<QI", 1, 0xFFFFFFFF), "count"),
    ("meta", struct.pack("<I", 1) + b"w" + bytes([0, 2]) + struct.pack("<I", 0x7FFFFFFF), "count"),
    ("meta", _meta()[:-1], "malformed"),
    ("meta", _meta().replace(bytes([0, 2]), bytes([0, 200]), 1), "dtype 200"),
    ("meta", _meta().replace(struct.pack("<i", -1) + bytes([0]),
                             struct.pack("<i", -1) + bytes([9]), 1), "wire 9"),
    ("store", bytes([5]) + struct.pack("<I", 0xFFFFFFFF), "count"),
    ("store", _store_request() + b"x", "trailing"),
    ("store", bytes([99]), "unknown store request"),
    ("hello", VALID["hello"][:-1], "malformed"),
    ("hello", b"\x00" * 45, "not a tfring handshake"),
    ("frame", struct.pack("<I", 0xFFFFFFFF), "exceeds"),
    ("frame", struct.pack("<I", (1 << 30) - 1) + b"abc", "closed by the peer"),
])
def test_parsers_reject_hostile_input_cleanly(kind, data, match):
    with pytest.raises(_core.TfringError, match=match):
        _core_testing.fuzz_parse(kind, data)


# ------------------------------------------------- hostile live clients ----

def _still_serves(srv):
    c = _client(srv)
    token = os.urandom(8)
    c.set("alive", token)
    assert c.get("alive", 5.0) == token


def test_store_server_drops_half_sent_frames(monkeypatch):
    # A hello frame that never completes holds only its own connection, and
    # not for longer than the handshake timeout, which also bounds a
    # request's body: TFRING_HANDSHAKE_TIMEOUT (default 10 s), read when the
    # server is made.
    monkeypatch.setenv("TFRING_HANDSHAKE_TIMEOUT", "1")
    srv = _core.TcpStoreServer("127.0.0.1", 0, SECRET)
    try:
        start = time.monotonic()
        with _raw(srv, timeout=30) as hello, _raw(srv, timeout=30) as request:
            hello.sendall(struct.pack("<I", 45) + b"\x47\x52")
            assert wire_util.handshake(request, SECRET)
            request.sendall(struct.pack("<I", 1000) + b"\x02")  # the body never follows
            _still_serves(srv)
            assert hello.recv(64) == b""  # closed by the server
            hello_closed = time.monotonic() - start
            assert request.recv(64) == b""
            request_closed = time.monotonic() - start
        # The variable's 1 s, not the default 10 s.
        assert 0.9 <= hello_closed < 8, hello_closed
        assert 0.9 <= request_closed < 8, request_closed
    finally:
        srv.stop()


# ---------------------------------------------------------- live 2-rank job ----

def _spawn_job(mode, env=None, n=2):
    secret = os.urandom(16).hex()
    srv = _core.TcpStoreServer("127.0.0.1", 0, secret)
    outdir = os.path.join(os.environ.get("PYTEST_TMPDIR", "/tmp"), "tfring-sec-" + secret[:8])
    os.makedirs(outdir, exist_ok=True)
    procs = []
    for r in range(n):
        e = dict(os.environ, TFRING_RANK=str(r), TFRING_SIZE=str(n),
                 TFRING_STORE_ADDR=f"127.0.0.1:{srv.port}", TFRING_SECRET=secret,
                 TFRING_TIMEOUT="30", TFRING_RESULT=os.path.join(outdir, f"{r}.json"),
                 TFRING_TRANSPORT="tcp", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, os.path.join(WORKERS, "security.py"), mode],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return srv, secret, procs, outdir


def _finish_job(srv, procs, outdir, timeout=90):
    results = []
    try:
        for r, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} hung past {timeout} s")
            path = os.path.join(outdir, f"{r}.json")
            assert p.returncode == 0 and os.path.exists(path), f"rank {r} crashed: {err[-3000:]}"
            with open(path) as f:
                results.append(json.load(f))
            os.unlink(path)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        srv.stop()
    return results


def test_wrong_secret_on_a_ring_link_fails_both_ranks_naming_the_peer():
    srv, _, procs, outdir = _spawn_job("wrong_secret")
    res = _finish_job(srv, procs, outdir)
    for r, out in enumerate(res):
        other = 1 - r
        assert "error" in out, f"rank {r} joined a job with another secret"
        assert "MismatchError" in out["error"], out["error"]
        assert f"rank {other} at" in out["error"], out["error"]
        assert "wrong job secret" in out["error"], out["error"]


def _listening_sockets(pid):
    """(ip, port) of every TCP socket `pid` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                addr, port = cols[1].split(":")
                if table == "tcp":
                    ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1])
                else:
                    ip = socket.inet_ntop(socket.AF_INET6, b"".join(
                        bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8)))
                found.append((ip, int(port, 16)))
    return found


def _wait_key(store, key, timeout=30.0):
    return store.get(key, timeout)


GARBAGE = [b"", b"GET / HTTP/1.0\r\n\r\n", struct.pack("<I", 0xFFFFFFFF),
           struct.pack("<I", 1 << 30) + b"xx", struct.pack("<I", 45) + b"\x47",
           frame(b"\x00" * 45),
           wire_util.client_hello(PURPOSE_RING, 1, os.urandom(32), version=2),
           wire_util.client_hello(PURPOSE_CONTROL, 1, os.urandom(32)),
           os.urandom(300)]


def _send_garbage(addr, port):
    """Sends every GARBAGE payload on its own connection; returns how many
    connections were made."""
    made = 0
    for payload in GARBAGE:
        try:
            with socket.create_connection((addr, port), timeout=5) as s:
                made += 1
                s.sendall(payload)
        except OSError:
            pass
    return made


def _stranger(addr, port, purpose):
    """Connects at once, then (on a thread, once the rank gets to accepting)
    runs the handshake with a wrong secret. The thread's result: False if
    rejected, True if let in, or the exception."""
    sock = socket.create_connection((addr, port), timeout=60)
    out = {}

    def run():
        with sock:
            try:
                out["accepted"] = wire_util.handshake(sock, "a stranger's guess", purpose, 1)
            except Exception as e:  # noqa: BLE001 - reported to the test
                out["accepted"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("iface", [None, "lo"])
def test_live_job_survives_garbage_and_listens_only_on_its_interface(iface):
    env = {"TFRING_IFACE": iface} if iface else {}
    srv, secret, procs, outdir = _spawn_job("gated", env=env)
    try:
        store = _core.TcpStore("127.0.0.1", srv.port, secret, 10.0)
        # Rank 0 has published where its ring listener is and waits for
        # rank 1, which waits for test/go: the listener is open meanwhile,
        # and what we send waits in its backlog, ahead of rank 1.
        host, pid, addr, port = _wait_key(store, "peer/0").decode().split("|")[:4]
        listening = _listening_sockets(int(pid))
        assert (addr, int(port)) in listening
        assert all(ip not in ("0.0.0.0", "::") for ip, _ in listening), listening
        if iface == "lo":
            assert addr == "127.0.0.1"
            assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
        assert _send_garbage(addr, int(port)) == len(GARBAGE)
        thread, verdict = _stranger(addr, int(port), PURPOSE_RING)
        store.set("test/go", b"1")
        # The coordinator's port is open only until every rank has joined:
        # attack it if we are quick enough (not asserted: a race by nature).
        try:
            _send_garbage(addr, int(_wait_key(store, "coord/port")))
        except _core.TfringError:
            pass
        thread.join(60)
        assert verdict.get("accepted") is False, f"a wrong secret got: {verdict}"
    except BaseException:
        for p in procs:
            p.kill()
        srv.stop()
        raise
    res = _finish_job(srv, procs, outdir)
    expected = [3.0 * i for i in range(1000)]
    for r, out in enumerate(res):
        assert "error" not in out, f"rank {r}: {out['error']}"
        assert out["sum"] == expected
        if iface == "lo":
            assert out["listen_addr"] == "127.0.0.1"


def test_unknown_interface_is_a_clear_error():
    code = ("from tfring import _core\n"
            "try:\n    _core._listen_address()\n"
            "except _core.TfringError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, TFRING_IFACE="nosuchif0"))
    assert "TFRING_IFACE=nosuchif0: no such network interface" in out.stdout, out


def test_single_host_jobs_bind_loopback():
    code = "from tfring import _core\nprint(_core._listen_address())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, TFRING_SIZE="4", TFRING_LOCAL_SIZE="4"))
    assert out.stdout.strip() == "127.0.0.1", out


# ------------------------------------------------------------ tfring.keras ----

def test_keras_is_an_attribute_of_tfring_loaded_lazily():
    code = ("import sys, tfring\n"
            "assert 'keras' not in sys.modules and 'tensorflow' not in sys.modules\n"
            "cb = tfring.keras.callbacks.BroadcastGlobalVariablesCallback\n"
            "import tfring.keras.callbacks as c\n"
            "assert cb is c.BroadcastGlobalVariablesCallback\n"
            "assert 'keras' in dir(tfring)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ------------------------------------------------- AddressSanitizer fuzz ----

def _have_asan(tmp_path):
    src = tmp_path / "t.cc"
    src.write_text("int main() { return 0; }\n")
    r = subprocess.run(["g++", "-fsanitize=address,undefined", str(src), "-o", str(tmp_path / "t")],
                       capture_output=True, timeout=120)
    return r.returncode == 0


def test_parsers_under_address_sanitizer(tmp_path):
    # The mutation fuzzer of tests/fuzz/parsers_asan.cc: each input in a heap
    # block of exactly its size, so an over-read aborts the run.
    try:
        if not _have_asan(tmp_path):
            pytest.skip("g++ cannot build with -fsanitize=address here")
    except FileNotFoundError:
        pytest.skip("no g++")
    # Built under the build directory, where ./dev.sh test compiles it in
    # the background meanwhile (run_asan.sh rebuilds only what is stale).
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    build = os.path.join(os.environ.get("TFRING_BUILD_DIR") or os.path.join(repo, "build"),
                         "fuzz-asan")
    r = subprocess.run(["bash", os.path.join(repo, "tests", "fuzz", "run_asan.sh"), "20000"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TFRING_FUZZ_BUILD=build))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for kind in ("meta", "response", "hello", "store"):
        assert f"{kind}: 20000 inputs" in r.stdout
