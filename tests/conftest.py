"""The test tree, by the layer each test drives (tests/README.md):

  tests/core/  the C++ core through tfring._core (collectives, runtime,
               vote, kernels, store, security, faults, scale, the build)
  tests/tf/    the TensorFlow ops, XLA, Keras, graph rewrite, training
  tests/run/   starting jobs: tfring-run, mpirun, bootstrap, elastic, clusters
  tests/hvd/   the Horovod-compatible API and Horovod's own examples
  tests/gpu/   GPU collectives (on a GPU, or the CUDA emulation build)

A new test file goes into the directory of the layer it drives. The
helpers beside this file (multiproc.py, tf_util.py, workers/, ...) stay
here and are importable from every test: this file puts tests/ on sys.path.

Every test must leave /dev/shm as it found it.

A job's ranks create shared-memory segments /dev/shm/tfring-<job>-r<rank>
(<job> starts with rank 0's pid in hex; the segment's header holds its
creator's pid) and unlink them once every neighbour has mapped them, so a
segment left after a test means a bug or a rank killed before unlinking.

Other jobs on this host may create segments while a test runs. A new
segment is this test's when a process that made it (rank 0 or the creator)
still runs and carries this session's marker in its environment, or when
both are gone (nothing else can be told then). Leftovers fail the test and
are removed.

Tests marked `slow` (soak repeats, the largest rank counts) are skipped
unless TFRING_TEST_SLOW=1; the default run keeps a smaller case of each.
"""

import os
import secrets
import struct
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

SHM = "/dev/shm"
PREFIX = "tfring-"
MARKER = "TESTS_TFRING_SHM_SESSION"  # inherited by every process a test starts
_token = os.environ.setdefault(MARKER, secrets.token_hex(8))
_PID_OFFSET = 20  # ShmHeader: magic u64, capacity u64, rank i32, pid i32
SLOW = os.environ.get("TFRING_TEST_SLOW", "") not in ("", "0")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a soak repeat or the largest scale of a test whose smaller case "
        "runs by default; runs only with TFRING_TEST_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow or soak case: TFRING_TEST_SLOW=1 runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def tfring_segments():
    try:
        return {n for n in os.listdir(SHM) if n.startswith(PREFIX)}
    except FileNotFoundError:
        return set()


def _pids(name):
    pids = []
    try:  # tfring-<rank 0 pid hex>-<time hex>-r<rank>
        pids.append(int(name[len(PREFIX):].split("-")[0], 16))
    except ValueError:
        pass
    try:
        with open(os.path.join(SHM, name), "rb") as f:
            head = f.read(_PID_OFFSET + 4)
        if len(head) == _PID_OFFSET + 4:
            pids.append(struct.unpack_from("<i", head, _PID_OFFSET)[0])
    except OSError:
        pass
    return pids


def _ours(name):
    alive = False
    for pid in _pids(name):
        if pid == os.getpid():
            return True  # (its /proc environ predates the marker)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except PermissionError:
            alive = True  # another user's process: not ours
            continue
        except OSError:
            continue  # gone
        alive = True
        if f"{MARKER}={_token}".encode() in env.split(b"\0"):
            return True
    return not alive


@pytest.fixture(autouse=True)
def no_shm_leftovers(request):
    before = tfring_segments()
    yield
    left = sorted(n for n in tfring_segments() - before if _ours(n))
    for name in left:
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            pass
    if left:
        pytest.fail(f"{request.node.nodeid} left shared-memory segments in "
                    f"{SHM} (removed now): {', '.join(left)}", pytrace=False)
