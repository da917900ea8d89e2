"""A rank that shows what its launcher gave it: prints one line
``RESULT <json>`` with its TFRING_*/HOROVOD_*/NCCL_* environment and, with
``init``, what the core read at tfring.init() and an allreduce of
rank-dependent data (sum over ranks of arange(16) * (rank + 1)).

    python hvd_env.py env     # no init: the environment only
    python hvd_env.py init    # tfring.init(), config and an allreduce
    python hvd_env.py late S  # sleeps S seconds on rank 1 before init
"""

import json
import os
import sys
import time

import numpy as np


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "env"
    out = {}
    if mode in ("init", "late"):
        import tfring.basics as basics
        from tfring import _core

        rank_hint = os.environ.get("TFRING_RANK", "0")
        if mode == "late" and rank_hint == "1":
            time.sleep(float(sys.argv[2]))
        basics.init()
        rank = basics.rank()
        x = np.arange(16, dtype=np.float64) * (rank + 1)
        out.update(rank=rank, size=basics.size(), config=_core.config(),
                   local_size=basics.local_size(),
                   allreduce=_core.allreduce(x, op="sum").tolist())
        basics.shutdown()
    out["env"] = {k: v for k, v in os.environ.items()
                  if k.startswith(("TFRING_", "HOROVOD_", "NCCL_")) and k != "TFRING_SECRET"}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
