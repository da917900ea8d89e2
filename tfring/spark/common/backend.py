"""Backend: how the estimator runs its training function on N ranks
(Horovod's horovod.spark.common.backend). SparkBackend runs it as one Spark
barrier stage through tfring.spark.run."""


def default_num_proc():
    """spark.default.parallelism of the active session (a classic
    SparkContext's defaultParallelism; over Spark Connect the server's
    setting, else the N of a local[N] master)."""
    from tfring.spark.runner import _active_session, default_parallelism

    kind, session = _active_session()
    if kind == "connect":
        return default_parallelism(session)[0]
    return session.defaultParallelism


class Backend:
    """Runs the distributed training function. A custom backend runs it
    where the training environment is not the Spark application that holds
    the estimator; it must return ``fn``'s results in rank order."""

    def run(self, fn, args=(), kwargs=None, env=None):
        """Runs ``fn(*args, **kwargs)`` on every rank and returns the list of
        results, ordered by rank. ``env``: variables for the ranks."""
        raise NotImplementedError(f"{type(self).__name__} does not implement run")

    def num_processes(self):
        """How many ranks ``run`` starts."""
        raise NotImplementedError(f"{type(self).__name__} does not implement num_processes")


class SparkBackend(Backend):
    """Runs ``fn`` through ``tfring.spark.run`` (docs/spark.md): ``num_proc``
    ranks (default: spark.default.parallelism), each a task of one barrier
    stage. ``env`` and run()'s ``env`` are set in every task around fn (the
    driver's TFRING_* and HOROVOD_* tunables travel too; the driver's other
    variables do not, unlike Horovod, whose mpirun copied them). The other
    arguments are tfring.spark.run's; a rank's failure raises
    tfring.spark.SparkJobError naming it."""

    def __init__(self, num_proc=None, env=None, stdout=None, stderr=None,
                 prefix_output_with_timestamp=False, verbose=1, nics=None,
                 start_timeout=None, **kwargs):
        if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
            raise ValueError(f"SparkBackend: num_proc must be a positive int, got {num_proc!r}")
        self._num_proc = num_proc or default_num_proc()
        self._env = dict(env or {})
        self._run_kwargs = dict(stdout=stdout, stderr=stderr,
                                prefix_output_with_timestamp=prefix_output_with_timestamp,
                                verbose=verbose, nics=nics, start_timeout=start_timeout,
                                **kwargs)

    def run(self, fn, args=(), kwargs=None, env=None):
        import tfring.spark

        full_env = dict(self._env)
        full_env.update(env or {})
        return tfring.spark.run(fn, args=tuple(args), kwargs=dict(kwargs or {}),
                                num_proc=self._num_proc, env=full_env, **self._run_kwargs)

    def num_processes(self):
        return self._num_proc
