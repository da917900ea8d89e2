"""What runs inside the Ray processes that hold tfring's ranks: the actor
class of RayExecutor, and the functions the Ray Train backend sends to its
workers. The ranks join the job with ``tfring.init()`` as under tfring-run:
the driver (or the Train backend) sets the same TFRING_* variables in each
process first (tfring/run/launcher.py: rank_env)."""

import os
import socket

import ray

from tfring.run import affinity

# The rendezvous store of a Ray Train run, served by its rank 0 process.
_train_store = None


def node_info():
    """Where this process runs: Ray node id and address, host name, pid,
    the GPU ids Ray gave it."""
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "machine": affinity.machine_identity(),
    }


def set_env(env):
    os.environ.update({k: str(v) for k, v in env.items()})


def bind_cores(index, count):
    """Binds this process to the ``index``-th of ``count`` equal slices of
    its machine's cores (tfring/run/affinity.py), as tfring-run binds the
    ranks it starts; returns the CPUs, or None when there are fewer cores
    than ranks. Ray gives an actor a CPU count, not particular cores: left
    unbound, the ranks of one machine share cores with each other's
    progress loops and thread pools, and every step takes longer."""
    cpus = affinity.slice_for(index, count)
    affinity.bind_process(cpus)
    return cpus


def leave_job():
    """Leaves the tfring job if this process is in one (before Ray stops it,
    or before the process joins a later job)."""
    import tfring

    if tfring.is_initialized():
        tfring.shutdown()


def serve_store(bind_host, secret):
    """Serves a Ray Train run's rendezvous store from this process; returns
    its port. A store left by an earlier run in this process is stopped."""
    global _train_store
    from tfring import _core

    stop_store()
    _train_store = _core.TcpStoreServer(bind_host, 0, secret)
    return _train_store.port


def stop_store():
    global _train_store
    if _train_store is not None:
        _train_store.stop()
        _train_store = None


class TfringWorker:
    """The Ray actor that holds one rank of a RayExecutor job. ``executable``
    is the object of the ``executable_cls`` given to ``start`` (None
    without one); ``execute(fn)`` runs ``fn(executable)``."""

    executable = None

    def node_info(self):
        return node_info()

    def update_env_vars(self, env_vars):
        set_env(env_vars)

    def bind_cores(self, index, count):
        return bind_cores(index, count)

    def env_vars(self):
        return dict(os.environ)

    def start_executable(self, executable_cls=None, executable_args=None,
                         executable_kwargs=None):
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()),
                                             **(executable_kwargs or {}))

    def execute(self, fn):
        return fn(self.executable)

    def run(self, fn, args, kwargs):
        return fn(*args, **kwargs)

    def leave_job(self):
        leave_job()
