"""Worker of tests/tf/test_tf_ops.py: every rank runs every check (the TF
ops in eager, tf.function and session modes against numpy references,
their gradients, and the op-level contracts) and reports each one.

    python tests/workers/tf_ops.py [--only check,check]   (under a launcher)

Under TEST_PASSES (tests/workers/common.py), a pass's TEST_ONLY names the
checks of that pass.
"""

import functools
import os
import sys

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

MODES = ["eager", "function", "session"]
CHECKS = (
    [f"{op}_{mode}" for op in ("allreduce", "grouped_allreduce", "allgather",
                               "broadcast", "reducescatter")
     for mode in MODES]
    + [f"grad_{op}_{mode}" for op in ("allreduce", "grouped_allreduce",
                                      "allgather", "broadcast",
                                      "reducescatter")
       for mode in ("eager", "function")]
    + ["grad_allreduce_session",
       "indexed_slices", "compression_fp16", "broadcast_variables",
       "not_merged_or_folded", "function_ops_run_independently",
       "function_names", "out_of_order_single_thread",
       "xla_compiles", "mismatch_error", "grouped_rides_vote",
       "grouped_outputs_independent",
       "version_mismatch", "api_surface"]
)

# Run by their own tests, with their own environment.
EXTRA_CHECKS = ["grouped_under_packing_algorithms"]


def _all_checks():
    import tf_ops_contracts
    from tf_ops_cases import _CASE_BUILDERS, _numeric_check
    from tf_ops_grads import _GRAD_CHECKS

    checks = {}
    for op in _CASE_BUILDERS:
        for mode in MODES:
            checks[f"{op}_{mode}"] = _numeric_check(op, mode)
    for op, make in _GRAD_CHECKS.items():
        for mode in ("eager", "function"):
            checks[f"grad_{op}_{mode}"] = make(mode)
    checks["grad_allreduce_session"] = _grad_session
    for name in CHECKS + EXTRA_CHECKS:
        fn = getattr(tf_ops_contracts, f"check_{name}", None)
        if fn is not None:
            checks[name] = fn
    return checks


def _grad_session(tf, tfring, rank, size):
    """tf.gradients in a tf.compat.v1 graph, for each op."""
    import numpy as np
    from tf_ops_cases import _values
    from tf_ops_grads import _assert_close, _gradient

    w = np.random.default_rng(660 + rank).normal(size=(4, 2))
    ws = [np.random.default_rng(660 + r).normal(size=(4, 2)) for r in range(size)]
    x = _values("float64", (4, 2), rank, 661)
    got = _gradient(tf, "session", lambda t: tfring.allreduce(t), x, w)
    _assert_close("allreduce", got, np.sum(ws, axis=0) / size)
    got = _gradient(tf, "session", lambda t: tfring.broadcast(t, 0), x, w)
    _assert_close("broadcast", got, np.mean(ws, axis=0) if rank == 0 else 0 * w)


def _worker():
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import tfring

    checks = _all_checks()
    missing = [c for c in CHECKS if c not in checks]
    assert not missing, missing
    sys.path.insert(0, os.path.join(TESTS, "workers"))
    from common import run_checks, run_passes

    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else CHECKS

    def body():
        # A pass of TEST_PASSES may name its own checks (TEST_ONLY).
        names = os.environ["TEST_ONLY"].split(",") if os.environ.get("TEST_ONLY") else only
        rank, size = tfring.rank(), tfring.size()
        return run_checks({name: functools.partial(checks[name], tf, tfring, rank, size)
                           for name in names})

    # Once (init, checks, report, shutdown), or once per pass of TEST_PASSES.
    run_passes(body)


if __name__ == "__main__":
    _worker()
