"""Ranks that leave the job on purpose, at different times: the ranks LEAVERS
leave right after a collective (MODE: shutdown, exit, or kill), the others
stay (STAY: idle, or submitting) a while, then leave themselves. Each
reports the errors it saw."""

import os
import signal
import sys
import time

import numpy as np

from common import report

import tfring.basics as basics
from tfring import _core

mode = os.environ["MODE"]
stay = os.environ.get("STAY", "idle")
basics.init()
rank = basics.rank()
leavers = [int(r) for r in os.environ.get("LEAVERS", "1").split(",")]
seen = {"errors": [], "rounds": 0}
x = np.ones(256, np.float32)
for i in range(3):
    _core.allreduce(x, name=f"step.{i}")
if rank in leavers:
    if mode == "shutdown":
        basics.shutdown()
    elif mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    report(seen)
    sys.exit(0)  # "exit": tfring shuts down at process exit
# The others stay a while after the leaver left: their engines see its
# links close, and hear of the departure (or the death) from the coordinator.
deadline = time.time() + float(os.environ.get("STAY_S", "1.0"))
while time.time() < deadline:
    if stay == "submit":
        try:
            _core.allreduce(x, name=f"after.{seen['rounds']}")
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            seen["errors"].append(f"{type(e).__name__}: {e}")
        seen["rounds"] += 1
    time.sleep(0.01)
if stay == "idle":
    try:
        _core.allreduce(x, name="late")
    except Exception as e:  # noqa: BLE001
        seen["errors"].append(f"{type(e).__name__}: {e}")
basics.shutdown()
report(seen)
