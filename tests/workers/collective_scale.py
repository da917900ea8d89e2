"""The allreduce passes of scale.py and the allgather/broadcast passes of
gather_scale.py on the ranks of one launch: each pass of TEST_PASSES names
its body with TEST_BODY ("allreduce" or "gather"); argv[1], "stats" or
"full", is the mode of both (see those workers)."""

import os
import sys

from common import run_passes

import gather_scale
import scale

mode = sys.argv[1] if len(sys.argv) > 1 else "full"
BODIES = {
    "allreduce": scale.stats_pass if mode == "stats" else scale.full_pass,
    "gather": gather_scale.stats_pass if mode == "stats" else gather_scale.full_pass,
}

run_passes(lambda: BODIES[os.environ["TEST_BODY"]]())
