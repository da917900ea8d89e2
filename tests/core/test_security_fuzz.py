"""Bounded fuzzing (hypothesis) of tfring's security layer: SHA-256/HMAC
against hashlib, every parser over mutated valid messages, and a live store
server fed garbage by strangers and by authenticated clients. The fixed
cases and the live-job attacks are in test_security.py."""

import hashlib
import hmac
import socket
import struct

import pytest

from tfring import _core, _core_testing

import wire_util
from test_security import SECRET, VALID, _raw, _still_serves, server  # noqa: F401 - fixture
from wire_util import frame

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(key=st.binary(max_size=200), msg=st.binary(max_size=600))
def test_sha256_and_hmac_match_hashlib(key, msg):
    # Lengths around the 55/56/64-byte padding edges come up often here.
    assert _core_testing.sha256(msg) == hashlib.sha256(msg).digest()
    assert _core_testing.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def _mutations(kind):
    base = VALID[kind]
    return st.one_of(
        st.binary(max_size=300),
        st.integers(0, len(base)).map(lambda n: base[:n]),  # truncated
        st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255)).map(
            lambda t: base[:t[0]] + bytes([t[1]]) + base[t[0] + 1:]),  # one byte changed
        st.tuples(st.integers(0, max(0, len(base) - 4)), st.sampled_from(
            [0xFFFFFFFF, 0x7FFFFFFF, 0x10000, 1 << 30])).map(
            lambda t: base[:t[0]] + struct.pack("<I", t[1]) + base[t[0] + 4:]),  # huge count
        st.tuples(st.binary(max_size=40), st.binary(max_size=40)).map(
            lambda t: t[0] + base + t[1]),
    )


@pytest.mark.parametrize("kind", sorted(VALID))
def test_fuzz_parsers(kind):
    @FUZZ
    @given(data=_mutations(kind))
    def run(data):
        try:
            _core_testing.fuzz_parse(kind, data)
        except _core.TfringError:
            pass  # a clean, typed error is the expected outcome for garbage

    run()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.one_of(
    st.binary(max_size=200),
    _mutations("hello").map(lambda b: struct.pack("<I", len(b)) + b),
    st.sampled_from([struct.pack("<I", 0xFFFFFFFF), struct.pack("<I", 1 << 30) + b"x" * 10,
                     frame(b"")])))
def test_store_server_survives_garbage_clients(server, payload):
    with _raw(server) as s:
        s.sendall(payload)
    _still_serves(server)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=st.one_of(st.binary(max_size=200), _mutations("store")))
def test_store_server_survives_garbage_from_authenticated_clients(server, request):
    with _raw(server) as s:
        assert wire_util.handshake(s, SECRET)
        s.sendall(frame(request))
        s.settimeout(5)
        try:  # either an answer or the connection closed; never a crash
            s.recv(64)
        except socket.timeout:
            pytest.fail("the store neither answered nor closed a garbage request")
        except ConnectionResetError:
            pass
    _still_serves(server)
