"""tfring's Keras estimator for Spark ML (Horovod's horovod.spark.keras):
KerasEstimator trains a Keras 3 model on a DataFrame with tfring ranks in
Spark tasks and returns a KerasModel, the Spark ML Model that predicts
with it. docs/spark-estimator.md and docs/spark-model.md.

ScaledLearningRateSchedule (imported on first use, with Keras) is the
schedule the ranks train with when the optimizer has a
LearningRateSchedule; importing it registers it with Keras, so
keras.models.load_model opens such a run's checkpoints."""

from tfring.spark.keras.estimator import KerasEstimator
from tfring.spark.keras.model import KerasModel

__all__ = ["KerasEstimator", "KerasModel", "ScaledLearningRateSchedule"]


def __getattr__(name):
    if name == "ScaledLearningRateSchedule":
        from tfring.spark.keras._schedule import ScaledLearningRateSchedule

        return ScaledLearningRateSchedule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
