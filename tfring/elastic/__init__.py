"""Elastic training: the job shrinks and grows without restarting survivors.

Horovod's API (``hvd.elastic``) under the same names:

    import tfring as hvd
    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, steps):
            train_step()
            if state.batch % 10 == 0:
                state.commit()

    train(state)

launched with ``tfring-run --min-np 2 --max-np 8 --host-discovery-script
./hosts.sh python train.py``. See docs/elastic.md.
"""

import importlib

from tfring.elastic.state import (  # noqa: F401 - the public API
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    broadcast_object,
    run,
    run_fn,
)

# Loaded on first use: they import TensorFlow.
_LAZY = {"TensorFlowState": "tfring.elastic.tensorflow",
         "TensorFlowKerasState": "tfring.elastic.tensorflow"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfring.elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
