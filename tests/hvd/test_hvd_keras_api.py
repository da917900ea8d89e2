"""`import tfring.keras as hvd` against Horovod 0.28.1's
`horovod.tensorflow.keras` (with its `callbacks` and `elastic` modules).

The tables below list every public name of those modules with its
parameters in Horovod's order (read from Horovod 0.28.1's source). Every
name must exist on tfring.keras (Keras 3) and on tfring.keras.legacy
(tf_keras, when installed), and every call written with Horovod's keyword
arguments must bind to tfring's signature. The behaviour behind these names
is checked on ranks by tests/hvd/test_hvd_keras.py and tests/tf/test_keras.py.
"""

import importlib
import os
import sys

import pytest

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, TESTS)

from hvd_util import assert_takes_horovod_call  # noqa: E402
from tf_util import tf_available  # noqa: E402

# name -> [parameters in Horovod's order], or None: not called here (a
# constant, a class used as a value, a module). A leading "*" marks a
# required positional argument (bound positionally).
HOROVOD_TF_KERAS = {
    # re-exported from horovod.tensorflow
    "init": ["comm", "process_sets"],
    "shutdown": [],
    "is_initialized": [],
    "start_timeline": ["*file_path", "mark_cycles"],
    "stop_timeline": [],
    "size": [], "local_size": [], "cross_size": [],
    "rank": [], "local_rank": [], "cross_rank": [],
    "mpi_threads_supported": [], "mpi_enabled": [], "mpi_built": [],
    "gloo_enabled": [], "gloo_built": [],
    "nccl_built": [], "ddl_built": [], "ccl_built": [], "cuda_built": [],
    "rocm_built": [],
    "ProcessSet": ["*ranks_or_comm"],
    "global_process_set": None,
    "add_process_set": ["*process_set"],
    "remove_process_set": ["*process_set"],
    "Average": None, "Sum": None,
    "Compression": None,
    "callbacks": None, "elastic": None,
    # horovod.tensorflow.keras itself
    "DistributedOptimizer": [
        "*optimizer", "name", "device_dense", "device_sparse", "compression",
        "sparse_as_dense", "gradient_predivide_factor", "op",
        "backward_passes_per_step", "average_aggregated_gradients",
        "num_groups", "groups", "process_set", "scale_local_gradients"],
    "broadcast_global_variables": ["*root_rank"],
    "allreduce": ["*value", "name", "average", "prescale_factor",
                  "postscale_factor", "op", "compression"],
    "allgather": ["*value", "name"],
    "broadcast": ["*value", "*root_rank", "name"],
    "reducescatter": ["*value", "name", "op"],
    "load_model": ["*filepath", "custom_optimizers", "custom_objects",
                   "compression", "legacy_opts"],
}

HOROVOD_KERAS_CALLBACKS = {
    "BroadcastGlobalVariablesCallback": ["*root_rank", "device",
                                         "local_variables"],
    "MetricAverageCallback": ["device"],
    "LearningRateScheduleCallback": [
        "*initial_lr", "*multiplier", "start_epoch", "end_epoch", "staircase",
        "momentum_correction", "steps_per_epoch"],
    "LearningRateWarmupCallback": ["*initial_lr", "warmup_epochs",
                                   "momentum_correction", "steps_per_epoch",
                                   "verbose"],
    "BestModelCheckpoint": ["monitor", "verbose", "save_weights_only", "mode",
                            "save_freq"],
}

HOROVOD_KERAS_ELASTIC = {
    # KerasState(model, optimizer=None, **kwargs): extra keywords are
    # further state to keep (Horovod's ObjectState).
    "KerasState": ["*model", "optimizer", "batch", "epoch"],
    "CommitStateCallback": ["*state", "batches_per_commit"],
    "UpdateBatchStateCallback": ["*state"],
    "UpdateEpochStateCallback": ["*state"],
    "run": ["*func"],
}

TABLES = {"": HOROVOD_TF_KERAS, "callbacks": HOROVOD_KERAS_CALLBACKS,
          "elastic": HOROVOD_KERAS_ELASTIC}


def _legacy_available():
    try:
        importlib.import_module("tf_keras")
        return True
    except ImportError:
        return False


FLAVOURS = ["tfring.keras", "tfring.keras.legacy"]
CASES = [(flavour, sub, name) for flavour in FLAVOURS
         for sub, table in TABLES.items() for name in sorted(table)]


def _ids(case):
    flavour, sub, name = case
    return f"{flavour}{'.' + sub if sub else ''}.{name}"


def _module(flavour, sub):
    if not tf_available("keras"):
        pytest.skip("TensorFlow, Keras or tfring's op library missing")
    if flavour.endswith("legacy") and not _legacy_available():
        pytest.skip("tf_keras is not installed (pip install tf_keras)")
    mod = importlib.import_module(flavour)
    if sub:
        mod = getattr(mod, sub)
    return mod


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_name_exists(case):
    flavour, sub, name = case
    mod = _module(flavour, sub)
    where = f"{flavour}{'.' + sub if sub else ''}"
    horovod = f"horovod.tensorflow.keras{'.' + sub if sub else ''}.{name}"
    assert hasattr(mod, name), f"{where} has no {name} ({horovod})"


CALLABLE = [c for c in CASES if TABLES[c[1]][c[2]] is not None]


@pytest.mark.parametrize("case", CALLABLE, ids=_ids)
def test_horovod_keywords_bind(case):
    flavour, sub, name = case
    mod = _module(flavour, sub)
    params = TABLES[sub][name]
    assert_takes_horovod_call(f"{flavour}.{name}", getattr(mod, name), params)


def test_reduce_op_constants_are_tfrings():
    mod = _module("tfring.keras", "")
    import tfring

    assert mod.Average is tfring.Average and mod.Sum is tfring.Sum
    assert mod.global_process_set is tfring.global_process_set
