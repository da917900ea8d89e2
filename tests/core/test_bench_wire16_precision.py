"""benchmarks/wire16_precision.py: its design emulations add every rank's
input exactly once (0s and 1s, exact on any wire, must sum exactly),
and its table's reference row, one rounding of the exact result, is
within 1 u in every draw."""

import sys

import numpy as np
import pytest
from bench_util import BENCH

sys.path.insert(0, BENCH)
import wire16_precision as wp  # noqa: E402


@pytest.mark.parametrize("n", [3, 8, 9])
@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_every_scheme_adds_each_rank_once(n, wire):
    rng = np.random.default_rng(n)
    # 0 or 1 per rank and element: every partial is a small integer, exact
    # in 16-bit words, and a rank missing or added twice changes the sum
    # wherever it holds a 1.
    xs = rng.integers(0, 2, (n, 64)).astype(np.float32)
    ref = xs.astype(np.float64).sum(axis=0)
    for name, f in wp.schemes(n).items():
        np.testing.assert_array_equal(f(xs, wire, ref), ref.astype(np.float32), err_msg=name)


def test_table(capsys):
    wp.main(["--ranks", "2,8", "--wires", "float16", "--draws", "3", "--count", "257"])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 2 |")
            or r.startswith("| 8 |")]
    assert len(rows) == len(wp.schemes(2)) + len(wp.schemes(8))
    for r in rows:
        if "one rounding" in r:
            assert r.endswith("| 0% |"), r
