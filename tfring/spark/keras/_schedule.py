"""ScaledLearningRateSchedule: a Keras learning-rate schedule multiplied by
a constant, the number of ranks in a KerasEstimator fit.

A float learning rate is scaled by setting the optimizer's rate to
rate * size. A LearningRateSchedule cannot be set that way (Keras refuses
to assign a float over a schedule), so each rank wraps the user's schedule:
the optimizer then uses ``schedule(step) * size`` at every step. The
wrapper is a registered Keras serializable ("tfring>ScaledLearningRateSchedule"),
so the checkpoints rank 0 writes (whose optimizer config holds it) load
wherever this module has been imported, which tfring's own loaders do.

The user's schedule is kept inside whole: ``unscaled(schedule)`` gives it
back, which is how the estimator returns the model with the schedule it
was given, and why a run resumed from a checkpoint is scaled once (the
ranks wrap the user's schedule afresh; they never wrap a wrapper).

Importing this module imports Keras.
"""

import keras

_PACKAGE = "tfring"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ScaledLearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule(step) * multiplier``.

    Args:
        schedule: a keras.optimizers.schedules.LearningRateSchedule (or its
            Keras config).
        multiplier: the constant factor (the number of ranks).
    """

    def __init__(self, schedule, multiplier):
        if isinstance(schedule, dict):
            schedule = keras.optimizers.schedules.deserialize(schedule)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise TypeError(f"ScaledLearningRateSchedule wraps a keras LearningRateSchedule, "
                            f"got {type(schedule).__name__}")
        self.schedule = schedule
        self.multiplier = float(multiplier)

    def __call__(self, step):
        return self.schedule(step) * self.multiplier

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                "multiplier": self.multiplier}

    @classmethod
    def from_config(cls, config):
        # Deserialized under the loader's custom objects (Keras runs
        # from_config inside its custom-object scope), so a custom schedule
        # passed as a custom object is found here too.
        return cls(keras.optimizers.schedules.deserialize(config["schedule"]),
                   config["multiplier"])


def scale_optimizer(optimizer, multiplier):
    """Wraps the optimizer's schedule in place; returns True if it had one
    (a float rate is left to the caller)."""
    schedule = getattr(optimizer, "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return False
    optimizer.learning_rate = ScaledLearningRateSchedule(schedule, multiplier)
    return True


def unscaled(schedule):
    """The schedule a ScaledLearningRateSchedule wraps; anything else as it is."""
    if isinstance(schedule, ScaledLearningRateSchedule):
        return schedule.schedule
    return schedule


def unscale_optimizer(optimizer):
    """Puts the wrapped schedule back as the optimizer's; returns True if
    the optimizer had a ScaledLearningRateSchedule."""
    schedule = getattr(optimizer, "_learning_rate", None)
    if not isinstance(schedule, ScaledLearningRateSchedule):
        return False
    optimizer.learning_rate = schedule.schedule
    return True
