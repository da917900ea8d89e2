"""Timeline, configuration read-back and lifecycle checks on each rank."""

import json
import os

import numpy as np

from common import report

import tfring.basics as basics
from tfring import _core

basics.init()
rank = basics.rank()
for step in range(3):
    for i in range(4):
        _core.allreduce(np.ones(1000, np.float32), name=f"grad.{i}")
_core.allgather(np.ones((2, 2), np.float32), name="gathered")
cfg = _core.config()
basics.shutdown()
out = {"config": cfg}
try:
    _core.allreduce(np.ones(3, np.float32), name="after")
except Exception as e:  # noqa: BLE001
    out["after_shutdown"] = f"{type(e).__name__}: {e}"
path = os.environ.get("TFRING_TIMELINE", "").replace("{rank}", str(rank))
if path and os.path.exists(path):
    with open(path) as f:
        out["timeline"] = json.load(f)
report(out)
