"""Horovod-style scripts (examples/horovod_style_*.py), written with the
same calls in the same order as Horovod's published TF2 example and its
process-set documentation, run under tfring-run with only the import line
changed; their results are checked against numpy."""

import json
import os
import re

import numpy as np
import pytest

from tf_util import RANK_ENV, run_example, tf_available

needs_tf = pytest.mark.skipif(not tf_available(), reason="needs TensorFlow and tfring's op library")

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TIMEOUT = 300


def _run(np_, script, args, cwd):
    return run_example(script, args, cwd, dict(os.environ, PYTHONUNBUFFERED="1", **RANK_ENV),
                       TIMEOUT, np_=np_)


@needs_tf
def test_horovod_style_tf2_loop(tmp_path):
    out = _run(2, "horovod_style_tf2.py", ["--steps", "40", "--batch-size", "32"],
               tmp_path)
    ends = re.findall(r"rank (\d) loss ([\d.]+) weights sha256 (\w+)", out)
    assert sorted(r for r, _, _ in ends) == ["0", "1"], out[-3000:]
    assert len({d for _, _, d in ends}) == 1, f"ranks differ: {ends}"
    losses = [float(x) for x in re.findall(r"Step #\d+\tLoss: ([\d.]+)", out)]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    # Only rank 0 saved the checkpoint.
    assert any(f.startswith("ckpt") for f in os.listdir(tmp_path / "checkpoints"))


@needs_tf
@pytest.mark.parametrize("size", [2, 4])
def test_horovod_style_process_sets(tmp_path, size):
    out = _run(size, "horovod_style_process_sets.py", [], tmp_path)
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\[\d+\]<stdout>:(\{.*\})$", line)
        if m:
            row = json.loads(m.group(1))
            rows[row["rank"]] = row
    assert sorted(rows) == list(range(size)), out[-3000:]
    x = {r: np.arange(6, dtype=np.float64) + 10.0 * r for r in range(size)}
    for r, row in rows.items():
        members = list(range(r % 2, size, 2))
        assert row["set_ranks"] == members
        assert row["set_rank"] == members.index(r)
        np.testing.assert_allclose(row["allreduce"], sum(x[m] for m in members))
        np.testing.assert_allclose(row["allgather"],
                                   [x[q][:2] for q in range(size)])
        if size > 2 and r in (0, size - 1):
            np.testing.assert_allclose(row["broadcast"], x[size - 1])
        else:
            assert row["broadcast"] is None
