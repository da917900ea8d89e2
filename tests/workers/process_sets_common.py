"""What the checks of the process-set worker (process_sets.py) share, and the
job they run in: importing this module joins the job on 4 ranks, the static
mode with the sets [0, 2] and [1, 3] given to init(). Each check's result
goes into `results`, which the worker reports."""

import os
import sys
import time

import numpy as np

from common import checker

import tfring
import tfring.basics as basics
from tfring import _core

mode = sys.argv[1]
results = {}
_check = checker(results, announce=True)


def check(name):
    """checker's decorator, with each check's duration in its result."""
    def deco(fn):
        t0 = time.monotonic()
        _check(name)(fn)
        results[name]["seconds"] = round(time.monotonic() - t0, 2)
        return fn
    return deco


def store():
    host, port = os.environ["TFRING_STORE_ADDR"].rsplit(":", 1)
    return _core.TcpStore(host, int(port), os.environ["TFRING_SECRET"], 30.0)


def inputs(salt, ranks, shape=(1000,)):
    """Every rank's input, which every rank can regenerate."""
    return {r: np.random.default_rng(1000 * salt + r).normal(size=shape) for r in ranks}


def expect_error(fn, *needles):
    """Runs fn, which must raise; returns the message after checking it
    contains every needle."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        assert not missing, f"error {msg!r} lacks {missing}"
        return msg
    raise AssertionError(f"no error; expected one mentioning {needles}")


evens = odds = None  # the static mode's sets
if mode == "static":
    evens, odds = tfring.ProcessSet([2, 0]), tfring.ProcessSet([3, 1])
    basics.init(process_sets=[evens, odds])
else:
    basics.init()
rank, n = basics.rank(), basics.size()
assert n == 4, "these checks are written for 4 ranks"
