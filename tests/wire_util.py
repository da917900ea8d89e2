"""A Python implementation of tfring's connection handshake (see
csrc/common/wire.h), built on the standard library's hmac/hashlib: the tests
use it as an independent reference for the C++ side and to open
authenticated connections that then misbehave."""

import hashlib
import hmac
import os
import struct

MAGIC = 0x54465247
VERSION = 4
PURPOSE_RING, PURPOSE_CONTROL, PURPOSE_STORE = 1, 2, 3


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def recv_frame(sock):
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    return recv_exact(sock, n)


def client_hello(purpose, rank, nonce_c, version=VERSION):
    return frame(struct.pack("<IBIi", MAGIC, version, purpose, rank) + nonce_c)


def proof(secret, label, nonce_s, nonce_c, purpose, rank):
    msg = label + nonce_s + nonce_c + struct.pack("<IiB", purpose, rank, VERSION)
    return hmac.new(secret.encode(), msg, hashlib.sha256).digest()


def handshake(sock, secret, purpose=PURPOSE_STORE, rank=-1):
    """Runs the client side; returns True if the server accepted us and
    proved it knows the secret, False if it rejected us."""
    nonce_c = os.urandom(32)
    sock.sendall(client_hello(purpose, rank, nonce_c))
    m2 = recv_frame(sock)
    magic, version, status = struct.unpack("<IBB", m2[:6])
    assert (magic, version, status) == (MAGIC, VERSION, 0), (magic, version, status)
    nonce_s = m2[6:]
    assert len(nonce_s) == 32
    sock.sendall(frame(proof(secret, b"tfring client", nonce_s, nonce_c, purpose, rank)))
    try:
        m4 = recv_frame(sock)
    except EOFError:
        return False
    if m4[:1] != b"\x01":
        return False
    assert hmac.compare_digest(
        m4[1:], proof(secret, b"tfring server", nonce_s, nonce_c, purpose, rank))
    return True
