"""A Ray Train backend that makes the training workers the ranks of a
tfring job, in place of TensorFlow's MultiWorkerMirroredStrategy:

    from ray.train.tensorflow import TensorflowTrainer
    from tfring.ray import TfringConfig

    trainer = TensorflowTrainer(train_loop_per_worker,
                                tensorflow_config=TfringConfig(),
                                scaling_config=ScalingConfig(num_workers=4))

``train_loop_per_worker`` calls ``tfring.init()`` (or ``tfring.keras.init()``)
and trains with tfring's callback, optimizer or tape (docs/training.md). Its
tfring rank is Ray Train's world rank, and its local rank Ray Train's: both
count the workers that share a node address (tfring/ray/_layout.py).

When the worker group starts, the backend (in Ray Train's controller) asks
every worker for its node, has world rank 0 serve the run's rendezvous store
(a TcpStoreServer with a fresh secret, as tfring-run hosts it), and sets each
worker's TFRING_* variables. A restarted worker group (Ray Train's failure
handling) gets a new store and secret. On shutdown the workers leave the job
and rank 0 stops the store.

TensorflowTrainer takes any BackendConfig as its ``tensorflow_config``, and
TfringConfig names TensorFlow as its framework, so Ray Train reports the run
as a TensorFlow one. It does not subclass TensorflowConfig: importing
ray.train.tensorflow imports TensorFlow, which would then load in Ray Train's
controller too, where this config is unpickled. Unlike TensorflowConfig it
sets neither TF_CONFIG (tfring would read it) nor TF_USE_LEGACY_KERAS (tfring
trains Keras 3 models).
"""

import os
import secrets
from dataclasses import dataclass
from typing import Any, Dict, Optional

import ray
from ray.train.backend import Backend, BackendConfig

from tfring.ray import _layout, _worker
from tfring.run import affinity
from tfring.run.common import format_addr


@dataclass
class TfringConfig(BackendConfig):
    """timeout_s: the ranks' deadline for every wait (TFRING_TIMEOUT);
    None keeps tfring's default. env: more variables for every worker
    (TFRING_* tunables, docs/tunables.md)."""

    timeout_s: Optional[float] = None
    env: Optional[Dict[str, str]] = None

    @property
    def backend_cls(self):
        return _TfringBackend

    @property
    def framework(self):
        try:  # what Ray Train's own TensorflowConfig reports (not public API)
            from ray.train.v2._internal.util import TrainingFramework
        except ImportError:
            return None
        return TrainingFramework.TENSORFLOW

    def to_dict(self) -> Dict[str, Any]:
        return {"timeout_s": self.timeout_s, "env": dict(self.env or {})}


class _TfringBackend(Backend):
    # Ray Train gives each worker all its node's training GPUs, ordered so
    # that local rank i holds device i.
    share_cuda_visible_devices = True

    def on_start(self, worker_group, backend_config: TfringConfig):
        infos = worker_group.execute(_worker.node_info)
        for info in infos:
            info["gpu_ids"] = []  # CUDA_VISIBLE_DEVICES is Ray Train's (above)
        nodes = {info["node_id"] for info in infos}
        store_host = infos[0]["ip"] if len(nodes) > 1 else "127.0.0.1"
        secret = secrets.token_hex(16)
        port = worker_group.execute_single(0, _worker.serve_store, store_host, secret)
        common = {k: str(v) for k, v in (backend_config.env or {}).items()}
        if backend_config.timeout_s is not None:
            common["TFRING_TIMEOUT"] = str(backend_config.timeout_s)
        _, envs = _layout.rank_envs(infos, format_addr(store_host, port), secret, common,
                                    host_key="ip")
        ray.get([worker_group.execute_single_async(i, _worker.set_env, env)
                 for i, env in enumerate(envs)])
        if affinity.binding_enabled({**os.environ, **common}):
            ray.get([worker_group.execute_single_async(i, _worker.bind_cores, index, count)
                     for i, (index, count) in enumerate(_layout.machine_slots(infos))])

    def on_shutdown(self, worker_group, backend_config: TfringConfig):
        worker_group.execute(_worker.leave_job)
        worker_group.execute_single(0, _worker.stop_store)
