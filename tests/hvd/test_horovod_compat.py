"""tools/horovod_compat: the stand-in `horovod` package binds tfring itself
(so Horovod's tests exercise tfring, not a wrapper), and the summary of the
per-rank junit files reports what each rank saw."""

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPAT = os.path.join(ROOT, "tools", "horovod_compat")


def test_shim_binds_tfring_itself():
    code = (
        "import horovod.tensorflow as hvd\n"
        "from horovod.tensorflow.util import _executing_eagerly\n"
        "import horovod.tensorflow.elastic as el\n"
        "from horovod.runner.util.threads import in_thread\n"
        "import mock, unittest.mock, tfring, tfring.util, tfring.elastic\n"
        "assert hvd is tfring and el is tfring.elastic\n"
        "assert _executing_eagerly is tfring.util._executing_eagerly\n"
        "assert mock.patch is unittest.mock.patch\n"
        "box = []\n"
        "in_thread(box.append, (7,)).join()\n"
        "assert box == [7]\n"
        "print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(COMPAT, "shim"), ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _junit(path, cases):
    body = "".join(
        f'<testcase classname="m.T" name="{n}">{inner}</testcase>'
        for n, inner in cases)
    path.write_text(f'<testsuites><testsuite name="pytest">{body}'
                    '</testsuite></testsuites>')
    return str(path)


def test_summary_counts_rank0_and_names_differences(tmp_path):
    r0 = _junit(tmp_path / "rank0.xml", [
        ("test_a", ""), ("test_b", '<failure message="boom: x">tb</failure>'),
        ("test_c", '<skipped message="no gpu"/>')])
    r1 = _junit(tmp_path / "rank1.xml", [
        ("test_a", '<error message="hang">tb</error>'),
        ("test_b", '<failure message="boom">tb</failure>'),
        ("test_c", '<skipped message="no gpu"/>')])
    out = subprocess.run(
        [sys.executable, os.path.join(COMPAT, "summarize.py"), r0, r1],
        capture_output=True, text=True, timeout=60, check=True).stdout
    assert "rank 0: failed 1, passed 1, skipped 1 (of 3)" in out
    assert "FAILED T::test_b: boom: x" in out
    assert "rank 1 differs: T::test_a: rank 0 passed, rank 1 failed" in out
    assert "test_c" not in out
