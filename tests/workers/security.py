"""Rank side of tests/core/test_security.py.

  wrong_secret  rank 1 joins the ring with another job's secret (its store
                connection is fine): every rank must fail naming its peer.
  gated         rank 1 waits for the store key test/go before joining, so
                the test can attack rank 0's open ports meanwhile; then an
                allreduce checks the job still works.
"""

import os
import sys

import numpy as np

from common import report

from tfring import _core

mode = sys.argv[1]
rank, size = int(os.environ["TFRING_RANK"]), int(os.environ["TFRING_SIZE"])
host, port = os.environ["TFRING_STORE_ADDR"].rsplit(":", 1)
secret = os.environ["TFRING_SECRET"]
store = _core.TcpStore(host, int(port), secret, 30.0)
out = {"pid": os.getpid()}

if mode == "gated" and rank == 1:
    store.get("test/go", 60.0)
ring_secret = secret + "-other-job" if (mode == "wrong_secret" and rank == 1) else secret
try:
    _core.init(rank, size, store, ring_secret)
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    out["sum"] = _core.allreduce(x, name="x").tolist()
    out["listen_addr"] = _core._listen_address()
    _core.shutdown()
except _core.TfringError as e:
    out["error"] = f"{type(e).__name__}: {e}"
report(out)
