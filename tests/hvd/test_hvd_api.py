"""`import tfring as hvd` against Horovod 0.28.1's `horovod.tensorflow`.

1. The table below lists every public name of horovod.tensorflow 0.28.1
   with its parameters, in Horovod's order (read from Horovod's source; the
   helpers it re-exports for its own Keras layer are left out). Every name
   must exist on tfring and every call written with Horovod's keyword
   arguments must bind to tfring's signature. Names another part of tfring
   provides (process sets, alltoall and join, the optimizers and Keras)
   are checked as soon as that part is in the tree (its marker name exists).
2. tests/workers/hvd_api.py runs Horovod-style calls on 1, 2 and 3 ranks
   (Adasum and the grouped collectives on 4 too, where Adasum's tree has
   two levels) and checks every result against numpy (see that file).
"""

import os
import sys

import pytest

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, TESTS)

from hvd_util import assert_takes_horovod_call  # noqa: E402
from tf_util import JOB_TIMEOUT, RANK_ENV, tf_available  # noqa: E402

import tfring  # noqa: E402

# Who provides a name, and the name whose presence says that part is in.
API, PSETS, A2A, OPT, KERAS, ELASTIC = ("api", "process sets",
                                        "alltoall/join", "optimizers",
                                        "keras", "elastic")
_MARKERS = {PSETS: "ProcessSet", A2A: "alltoall",
            OPT: "PartialDistributedGradientTape",
            KERAS: "SyncBatchNormalization", ELASTIC: "elastic"}

# name -> (owner, [parameters in Horovod's order]); None: not callable.
# A leading "*" marks a required positional argument (bound positionally).
HOROVOD_TF = {
    # process
    "init": (API, ["comm", "process_sets"]),
    "shutdown": (API, []),
    "is_initialized": (API, []),
    "size": (API, []), "local_size": (API, []), "cross_size": (API, []),
    "rank": (API, []), "local_rank": (API, []), "cross_rank": (API, []),
    "is_homogeneous": (API, []),
    "start_timeline": (API, ["*file_path", "mark_cycles"]),
    "stop_timeline": (API, []),
    "rank_op": (API, ["name"]),
    "local_rank_op": (API, ["name"]),
    "size_op": (API, ["process_set_id", "name"]),
    "local_size_op": (API, ["name"]),
    "process_set_included_op": (API, ["process_set_id", "name"]),
    "mpi_threads_supported": (API, []), "mpi_enabled": (API, []),
    "mpi_built": (API, []), "gloo_enabled": (API, []), "gloo_built": (API, []),
    "nccl_built": (API, []), "ddl_built": (API, []), "ccl_built": (API, []),
    "cuda_built": (API, []), "rocm_built": (API, []),
    # reduce ops, compression
    "Average": (API, None), "Sum": (API, None), "Adasum": (API, None),
    "Min": (API, None), "Max": (API, None), "Product": (API, None),
    "Compression": (API, None),
    # collectives
    "allreduce": (API, ["*tensor", "average", "device_dense", "device_sparse",
                        "compression", "op", "prescale_factor",
                        "postscale_factor", "name", "process_set",
                        "ignore_name_scope"]),
    "grouped_allreduce": (API, ["*tensors", "average", "device_dense",
                                "device_sparse", "compression", "op",
                                "prescale_factor", "postscale_factor",
                                "process_set", "ignore_name_scope", "name"]),
    "reducescatter": (API, ["*tensor", "device_dense", "compression", "op",
                            "name", "process_set", "ignore_name_scope",
                            "prescale_factor", "postscale_factor"]),
    "grouped_reducescatter": (API, ["*tensors", "device_dense", "compression",
                                    "op", "process_set", "prescale_factor",
                                    "postscale_factor"]),
    "allgather": (API, ["*tensor", "name", "ignore_name_scope", "process_set"]),
    "grouped_allgather": (API, ["*tensors", "name", "ignore_name_scope",
                                "process_set"]),
    "broadcast": (API, ["*tensor", "*root_rank", "name", "ignore_name_scope",
                        "process_set"]),
    "broadcast_": (API, ["*variables", "*root_rank", "name", "process_set"]),
    "broadcast_variables": (API, ["*variables", "*root_rank", "process_set",
                                  "inplace"]),
    "broadcast_global_variables": (API, ["*root_rank"]),
    "BroadcastGlobalVariablesHook": (API, ["*root_rank", "device"]),
    "allgather_object": (API, ["*obj", "session", "name", "process_set"]),
    "broadcast_object": (API, ["*obj", "root_rank", "session", "name",
                               "process_set"]),
    "broadcast_object_fn": (API, ["root_rank", "session", "name",
                                  "process_set"]),
    # horovod.torch's; scripts moving between frameworks call it too
    "barrier": (API, ["process_set"]),
    "alltoall": (A2A, ["*tensor", "splits", "name", "ignore_name_scope",
                       "process_set"]),
    "join": (A2A, []),
    # process sets
    "ProcessSet": (PSETS, ["*ranks_or_comm"]),
    "global_process_set": (PSETS, None),
    "add_process_set": (PSETS, ["*process_set"]),
    "remove_process_set": (PSETS, ["*process_set"]),
    # training
    "DistributedOptimizer": (OPT, [
        "*optimizer", "name", "use_locking", "device_dense", "device_sparse",
        "compression", "sparse_as_dense", "backward_passes_per_step", "op",
        "gradient_predivide_factor", "average_aggregated_gradients",
        "num_groups", "groups", "process_set", "scale_local_gradients"]),
    "DistributedGradientTape": (OPT, [
        "*gradtape", "device_dense", "device_sparse", "compression",
        "sparse_as_dense", "op", "gradient_predivide_factor", "num_groups",
        "groups", "process_set", "scale_local_gradients"]),
    "PartialDistributedGradientTape": (OPT, [
        "*gradtape", "device_dense", "device_sparse", "compression",
        "sparse_as_dense", "op", "gradient_predivide_factor", "num_groups",
        "groups", "process_set", "local_layers", "scale_local_gradients"]),
    "SyncBatchNormalization": (KERAS, None),
    "elastic": (ELASTIC, None),
}


def _present(owner):
    return owner == API or _has(_MARKERS[owner])


def _has(name):
    try:
        getattr(tfring, name)
        return True
    except (AttributeError, ImportError):
        return False


def _skip_unless_present(owner):
    if owner == ELASTIC and not _present(owner):
        pytest.skip("tfring has no elastic training (docs/from-horovod.md)")
    if not _present(owner):
        pytest.skip(f"provided by the {owner} part of tfring, not in this tree yet")


@pytest.mark.parametrize("name", sorted(HOROVOD_TF))
def test_name_exists(name):
    if not tf_available():
        pytest.skip("TensorFlow or tfring's op library missing")
    owner, _ = HOROVOD_TF[name]
    _skip_unless_present(owner)
    assert _has(name), f"tfring has no {name} (horovod.tensorflow.{name})"


_CALLABLE = sorted(n for n, (_, params) in HOROVOD_TF.items() if params is not None)


@pytest.mark.parametrize("name", _CALLABLE)
def test_horovod_keywords_bind(name):
    if not tf_available():
        pytest.skip("TensorFlow or tfring's op library missing")
    owner, params = HOROVOD_TF[name]
    _skip_unless_present(owner)
    assert_takes_horovod_call(f"tfring.{name}", getattr(tfring, name), params)


def test_reduce_op_constants_distinct():
    ops = [tfring.Sum, tfring.Average, tfring.Min, tfring.Max, tfring.Product,
           tfring.Adasum]
    assert len(set(ops)) == len(ops)


# --------------------------------------------------------- on 1-3 ranks ----

SIZES = [1, 2, 3]
CHECKS = [
    "allreduce_horovod_keywords", "average_keyword_rules",
    "process_set_rejects_other_sets", "grouped_allreduce_horovod_keywords",
    "allgather_broadcast_reducescatter_horovod_keywords", "ignore_name_scope",
    "allgather_object", "broadcast_object", "broadcast_inplace",
    "broadcast_global_variables_and_hook", "barrier",
    "grouped_allgather", "grouped_reducescatter", "int16_uint16",
    "indexed_slices_integer_average", "allgather_gradient_is_averaged",
    "broadcast_gradient_is_averaged", "adasum", "topology_ops",
    "build_queries", "timeline_start_stop",
]

_jobs = {}


def _job(size, tmp_path_factory):
    if size not in _jobs:
        from multiproc import check_ok, run_ranks

        shared = tmp_path_factory.mktemp(f"hvd_api_{size}")
        _jobs[size] = check_ok(run_ranks(size, "hvd_api.py", [shared],
                                         env=RANK_ENV, timeout=JOB_TIMEOUT))
    return _jobs[size]


@pytest.mark.skipif(not tf_available(),
                    reason="TensorFlow or tfring's op library missing")
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("size", SIZES)
def test_on_ranks(size, check, tmp_path_factory):
    outs = _job(size, tmp_path_factory)
    failed = [(r, o[check].get("error")) for r, o in enumerate(outs)
              if not o[check]["ok"]]
    assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)


@pytest.mark.skipif(not tf_available(),
                    reason="TensorFlow or tfring's op library missing")
def test_adasum_and_grouped_on_4_ranks(tmp_path):
    from multiproc import check_ok, run_ranks

    checks = ["adasum", "grouped_allgather", "grouped_reducescatter"]
    outs = check_ok(run_ranks(4, "hvd_api.py", [tmp_path, ",".join(checks)],
                              env=RANK_ENV, timeout=JOB_TIMEOUT))
    for check in checks:
        failed = [(r, o[check].get("error")) for r, o in enumerate(outs)
                  if not o[check]["ok"]]
        assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)
    assert all("skipped" not in o["adasum"] for o in outs)
