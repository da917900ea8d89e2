"""tfring's Keras callbacks as Keras serializables, in this process (no
ranks): get_config / from_config round trips with non-default arguments,
through keras.saving too (the classes are registered as "tfring>Name");
the arguments a config cannot hold refused, naming the callback and the
argument; and neither constructing nor deserializing a callback
initialises tfring (a Spark driver saving or loading a KerasEstimator
rebuilds them): the runtime starts when fit hands a callback its model.
"""

import copy
import json
import os
import subprocess
import sys

import pytest

from tf_util import RANK_ENV, tf_available

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(
    not tf_available("keras"),
    reason="TensorFlow, Keras or tfring's op library (_tfring_ops.so) missing")


def _cases():
    import tfring
    from tfring.compression import Compression
    from tfring.keras import callbacks as C

    # (class, constructor kwargs, the config they give)
    return [
        (C.BroadcastGlobalVariablesCallback, dict(root_rank=1, device="/cpu:0"),
         dict(root_rank=1, device="/cpu:0")),
        (C.MetricAverageCallback, dict(device="/cpu:0"), dict(device="/cpu:0")),
        (C.LearningRateScheduleCallback,
         dict(initial_lr=0.25, multiplier=0.5, start_epoch=2, end_epoch=7, staircase=False,
              momentum_correction=False, steps_per_epoch=11),
         dict(initial_lr=0.25, multiplier=0.5, start_epoch=2, end_epoch=7, staircase=False,
              momentum_correction=False, steps_per_epoch=11)),
        (C.LearningRateWarmupCallback,
         dict(initial_lr=0.4, warmup_epochs=3, momentum_correction=False, steps_per_epoch=9,
              verbose=1),
         dict(initial_lr=0.4, warmup_epochs=3.0, momentum_correction=False, steps_per_epoch=9,
              verbose=1)),
        (C.RingAllreduceCallback,
         dict(root_rank=1, op=tfring.Sum, compression=Compression.bf16, fusion_threshold=4096,
              sparse_as_dense=True, average_metrics=False, verbose_all_ranks=True,
              checkpoint_all_ranks=True),
         dict(root_rank=1, op="sum", compression="bf16", fusion_threshold=4096,
              sparse_as_dense=True, average_metrics=False, verbose_all_ranks=True,
              checkpoint_all_ranks=True)),
        (C.ResumableCheckpointCallback,
         dict(directory="/tmp/tfring-ckpt", every_epochs=3, keep=5, root_rank=1),
         dict(directory="/tmp/tfring-ckpt", every_epochs=3, keep=5, root_rank=1)),
        (C.BestModelCheckpoint,
         dict(monitor="loss", verbose=1, save_weights_only=True, mode="min", save_freq=4,
              filepath="best.weights.h5"),
         dict(monitor="loss", verbose=1, save_weights_only=True, mode="min", save_freq=4,
              filepath="best.weights.h5")),
    ]


@pytest.fixture
def no_init(monkeypatch):
    """Fails any tfring.init() the test makes (as if tfring were not
    initialised yet, whatever an earlier test in this process did)."""
    from tfring import basics

    def init(*args, **kwargs):
        raise AssertionError("a callback initialised tfring")

    monkeypatch.setattr(basics, "is_initialized", lambda: False)
    monkeypatch.setattr(basics, "init", init)


def test_configs_round_trip_without_initialising_tfring(no_init):
    import keras

    for cls, kwargs, expected in _cases():
        cb = cls(**kwargs)
        config = cb.get_config()
        assert config == expected, cls.__name__
        json.dumps(config)  # plain JSON
        again = cls.from_config(copy.deepcopy(config))
        assert type(again) is cls and again.get_config() == config, cls.__name__

        # Through Keras' registry, as a saved estimator's callbacks load.
        ser = keras.saving.serialize_keras_object(cb)
        assert ser["registered_name"] == f"tfring>{cls.__name__}"
        rebuilt = keras.saving.deserialize_keras_object(copy.deepcopy(ser))
        assert type(rebuilt) is cls
        assert keras.saving.serialize_keras_object(rebuilt) == ser


def test_what_a_config_cannot_hold_is_refused_naming_it(no_init):
    import keras

    from tfring.compression import Compression
    from tfring.keras import callbacks as C

    cb = C.LearningRateScheduleCallback(0.1, lambda epoch: 0.5 ** epoch)
    with pytest.raises(ValueError, match=r"LearningRateScheduleCallback: its multiplier "
                                         r"argument .* Python callable"):
        cb.get_config()
    with pytest.raises(ValueError, match="LearningRateScheduleCallback: its multiplier"):
        keras.saving.serialize_keras_object(cb)

    var = keras.Variable(1.0)
    for cb in (C.BroadcastGlobalVariablesCallback(0, local_variables=[var]),
               C.BroadcastGlobalVariablesCallback(0)):
        cb.register_local_var(var)
        with pytest.raises(ValueError, match="BroadcastGlobalVariablesCallback: its "
                                             "local_variables argument"):
            cb.get_config()

    cb = C.RingAllreduceCallback(compression=Compression.powersgd())
    with pytest.raises(ValueError, match="RingAllreduceCallback: its compression argument"):
        cb.get_config()


_FRESH = r"""
import copy, json, sys
sys.path[:0] = sys.argv[1:3]  # tests/tf, tests
import keras
import tfring
import test_callback_config as t

out = {}
built = [cls(**kwargs) for cls, kwargs, _ in t._cases()]
configs = [keras.saving.serialize_keras_object(cb) for cb in built]
rebuilt = [keras.saving.deserialize_keras_object(copy.deepcopy(c)) for c in configs]
out["after_build_and_load"] = tfring.is_initialized()
out["same"] = [keras.saving.serialize_keras_object(cb) for cb in rebuilt] == configs
# First use: fit hands each callback its model (a job of one process here).
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
rebuilt[0].set_model(model)
out["after_set_model"] = tfring.is_initialized()
out["size"] = tfring.size()
print("RESULT " + json.dumps(out))
"""


def test_a_fresh_process_builds_and_loads_them_without_initialising():
    # No launcher's variables: init() makes a job of one process.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFRING_", "HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_",
                                "TF_CONFIG"))}
    env.update(RANK_ENV)
    proc = subprocess.run([sys.executable, "-c", _FRESH, HERE, os.path.dirname(HERE)],
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    assert out == {"after_build_and_load": False, "same": True, "after_set_model": True,
                   "size": 1}
