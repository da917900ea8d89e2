"""Process sets on 4 ranks; reports {check: {"ok", ...}} per mode.

Modes:
  core     -- the numpy-level collectives on two disjoint sets that run
              concurrently (each held while the other runs), an overlapping
              set, and a pending world collective that blocks neither set
  static   -- sets created by init(process_sets=[...]), dynamic add/remove
  errors   -- bad sets, a non-member calling, a removed set, a mismatch
  tf       -- the TF ops with process_set=, eager and tf.function, gradients
  alltoall_adasum -- alltoall with ragged splits and op=Adasum on sets
  fault    -- a member of a set dies: every survivor's error names it
  isolation -- each set has its own failure state, statistics and rank
              names: a failed set leaves the world and another set working

The checks are in process_sets_core.py, process_sets_tf.py and
process_sets_faults.py; process_sets_common.py joins the job.
"""

import numpy as np

from common import report
from process_sets_common import mode, results
from process_sets_core import run_core, run_errors, run_static
from process_sets_faults import run_fault, run_isolation
from process_sets_tf import run_alltoall_adasum, run_tf

import tfring.basics as basics
from tfring import _core


# Several modes separated by commas run one after the other in one launch,
# each on a fresh join (shutdown, init: no set of the last mode is left).
for i, m in enumerate(mode.split(",")):
    if i:
        basics.shutdown()
        basics.init()
    {"core": run_core, "static": run_static, "errors": run_errors, "tf": run_tf,
     "alltoall_adasum": run_alltoall_adasum, "fault": run_fault,
     "isolation": run_isolation}[m]()
    if m != "fault":
        # Every rank leaves the world together: nothing still needs a set.
        _core.allreduce(np.zeros(1), name="end")
report(results)
