"""tfring on Ray (docs/ray.md).

* ``RayExecutor``: Horovod's ``horovod.ray.RayExecutor`` API; the ranks are
  Ray actors, the driver hosts the job's rendezvous.
* ``TfringConfig``: a Ray Train backend; ``TensorflowTrainer(...,
  tensorflow_config=TfringConfig())`` runs the training function as the
  ranks of a tfring job (imported on first use: it loads ray.train).
"""

from tfring.ray.runner import RayExecutor, Settings, WorkerError

__all__ = ["RayExecutor", "Settings", "TfringConfig", "WorkerError"]


def __getattr__(name):
    if name == "TfringConfig":
        from tfring.ray.train import TfringConfig

        return TfringConfig
    raise AttributeError(f"module 'tfring.ray' has no attribute {name!r}")
