"""tfring's Keras estimator for Spark ML (Horovod's horovod.spark.keras):
KerasEstimator trains a Keras 3 model on a DataFrame with tfring ranks in
Spark tasks and returns a KerasModel, the Spark ML Model that predicts
with it. docs/spark-estimator.md and docs/spark-model.md."""

from tfring.spark.keras.estimator import KerasEstimator
from tfring.spark.keras.model import KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
