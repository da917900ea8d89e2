"""RayExecutor: a tfring job whose ranks are Ray actors, with the API of
Horovod's ``horovod.ray.RayExecutor``.

Start-up, in the driver process:
  1. a placement group reserves the workers' resources: one bundle per worker
     packed on as few nodes as fit (``num_workers``, Horovod's PACK), or one
     bundle per host on distinct nodes (``num_hosts`` x
     ``num_workers_per_host``, STRICT_SPREAD); inside a placement group
     already (a Ray Tune trial), the actors go into that one instead;
  2. one TfringWorker actor per worker reports its Ray node; ranks are given
     node by node (tfring/ray/_layout.py), so a node's ranks are consecutive
     and local_rank / cross_rank mean what they mean under tfring-run;
  3. the driver serves the job's rendezvous store (the TcpStoreServer that
     tfring-run hosts, with a fresh secret) and sets each actor's TFRING_*
     variables; ``tfring.init()`` in the actors then joins as under
     tfring-run;
  4. each actor is bound to its share of its machine's cores, as tfring-run
     binds its ranks (unless TFRING_BIND=none).

``run`` waits on the ranks' results as they come: the first rank that
raises, or whose actor dies, fails the call with a WorkerError that names the
rank, actor, pid and node, FAILURE_GRACE_S later (the failures that follow in
that time are listed too, a dead actor first: its peers' errors, naming it,
may arrive before Ray reports the death). The other ranks, blocked in a
collective with the failed one, fail within ``timeout_s`` (TFRING_TIMEOUT).
"""

import os
import secrets
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tfring.ray import _layout
from tfring.ray._worker import TfringWorker
from tfring.run import affinity
from tfring.run.common import format_addr


# How long run() keeps gathering failures after the first (see _get).
FAILURE_GRACE_S = 3.0


class WorkerError(RuntimeError):
    """A rank of a RayExecutor job raised, or its actor died. ``rank``,
    ``actor_id``, ``node_id``, ``ip`` and ``pid`` say which; the Ray error is
    the ``__cause__``."""

    def __init__(self, message, rank, actor_id, node_id, ip, pid):
        super().__init__(message)
        self.rank, self.actor_id, self.node_id, self.ip, self.pid = (
            rank, actor_id, node_id, ip, pid)


@dataclass
class Settings:
    """What ``RayExecutor.create_settings`` returns.

    timeout_s: the ranks' deadline for every wait (TFRING_TIMEOUT): joining
        the job, and each collective once a peer stops answering.
    placement_group_timeout_s: how long start() waits for Ray to reserve the
        workers' resources and start the actors.
    nics: network interfaces the ranks may use; the first becomes
        TFRING_IFACE.
    ssh_identity_file: accepted for Horovod's API; Ray starts the workers,
        so nothing uses ssh.
    """

    timeout_s: int = 30
    placement_group_timeout_s: int = 100
    nics: Optional[set] = None
    ssh_identity_file: Optional[str] = None
    verbose: int = 1


class RayExecutor:
    """A tfring job on Ray: ``num_workers`` ranks (or ``num_hosts`` x
    ``num_workers_per_host``), each a Ray actor with ``cpus_per_worker`` CPUs
    and, with ``use_gpu``, ``gpus_per_worker`` GPUs (default 1).
    ``use_current_placement_group``: started inside a placement group, place
    the workers in it.

        executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4)
        executor.start()
        results = executor.run(train_fn)   # train_fn calls tfring.init()
        executor.shutdown()

    Elastic jobs (``min_workers`` / ``max_workers``) are not supported on Ray:
    use tfring-run --min-np/--max-np (docs/elastic.md)."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None):
        """Settings for the job (see Settings). ``ssh_str``, a private key,
        is written to ``ssh_identity_file`` as Horovod does, though nothing
        here uses ssh."""
        if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
            fd = os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(ssh_str)
        return Settings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                        nics=nics, ssh_identity_file=ssh_identity_file)

    def __init__(self, settings, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None,
                 use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 **elastic_options):
        if min_workers is not None or max_workers is not None or elastic_options:
            raise NotImplementedError(
                "tfring.ray.RayExecutor runs fixed-size jobs only: min_workers/max_workers "
                "(Horovod's elastic Ray executor) are not supported; for elastic training "
                "use tfring-run --min-np/--max-np with tfring.elastic (docs/elastic.md)")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give num_workers or num_hosts (with num_workers_per_host), "
                             f"not both (got num_workers={num_workers}, num_hosts={num_hosts})")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.settings = settings or Settings()
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers = []  # in rank order
        self._infos = []  # node_info() of each rank
        self._pg = None
        self._own_pg = False
        self._server = None
        self._failed = None  # the WorkerError that broke the current job

    # ------------------------------------------------------------ start ----

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None,
              extra_env_vars: Optional[Dict] = None):
        """Starts the workers and sets up the job's rendezvous; then creates
        ``executable_cls(*executable_args, **executable_kwargs)`` in each
        worker. ``extra_env_vars`` are set in every worker first."""
        if ray.util.client.ray.is_connected():
            raise NotImplementedError(
                "tfring.ray.RayExecutor needs a driver inside the Ray cluster (the driver "
                "serves the job's rendezvous store); Ray Client (ray://) is not supported")
        if self.workers:
            raise RuntimeError("RayExecutor.start: already started; call shutdown() first")
        try:
            self._start(executable_cls, executable_args, executable_kwargs,
                        extra_env_vars or {})
        except BaseException:
            self.shutdown()
            raise

    def _start(self, executable_cls, executable_args, executable_kwargs, extra_env_vars):
        actors = self._create_actors()
        deadline = self.settings.placement_group_timeout_s
        infos = self._get([a.node_info.remote() for a in actors], actors, None,
                          "reporting its node", timeout=deadline)
        order = _layout.order_by_node([i["node_id"] for i in infos])
        self.workers = [actors[i] for i in order]
        self._infos = [infos[i] for i in order]

        driver_node = ray.get_runtime_context().get_node_id()
        if all(i["node_id"] == driver_node for i in self._infos):
            store_host = "127.0.0.1"
        else:
            store_host = ray.util.get_node_ip_address()
        secret = secrets.token_hex(16)
        from tfring import _core

        self._server = _core.TcpStoreServer(store_host, 0, secret)
        common = _layout.forwarded_env(os.environ)
        common["TFRING_TIMEOUT"] = str(self.settings.timeout_s)
        if self.settings.nics:
            common["TFRING_IFACE"] = sorted(self.settings.nics)[0]
        common.update({k: str(v) for k, v in extra_env_vars.items()})
        _, envs = _layout.rank_envs(self._infos, format_addr(store_host, self._server.port),
                                    secret, common)
        self._get([w.update_env_vars.remote(e) for w, e in zip(self.workers, envs)],
                  self.workers, self._infos, "setting its environment")
        if affinity.binding_enabled({**os.environ, **common}):
            self._get([w.bind_cores.remote(i, n) for w, (i, n)
                       in zip(self.workers, _layout.machine_slots(self._infos))],
                      self.workers, self._infos, "binding its cores")
        self._get([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                   for w in self.workers], self.workers, self._infos,
                  "creating its executable")

    def _create_actors(self):
        cpus, gpus = self.cpus_per_worker, self.gpus_per_worker
        current = get_current_placement_group() if self.use_current_placement_group else None
        per_bundle = 1
        if current is not None:
            # Horovod's PGStrategy: the trial's placement group, any bundle.
            self._pg, self._own_pg = current, False
            count = self.num_workers or (self.num_hosts or 1) * self.num_workers_per_host
            bundle_of = [-1] * count
        elif self.num_hosts is not None:
            per_bundle = self.num_workers_per_host
            count = self.num_hosts * per_bundle
            self._reserve(self.num_hosts, cpus * per_bundle, gpus * per_bundle, "STRICT_SPREAD")
            bundle_of = [i // per_bundle for i in range(count)]
        else:
            if self.num_workers is None:
                raise ValueError("RayExecutor needs num_workers, or num_hosts and "
                                 "num_workers_per_host")
            count = self.num_workers
            self._reserve(count, cpus, gpus, "PACK")
            bundle_of = list(range(count))
        remote_cls = ray.remote(TfringWorker)
        actors = []
        for bundle in bundle_of:
            actors.append(remote_cls.options(
                num_cpus=cpus, num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=bundle,
                    placement_group_capture_child_tasks=False)).remote())
        return actors

    def _reserve(self, bundles, cpus, gpus, strategy):
        bundle = {"CPU": cpus}
        if gpus:
            bundle["GPU"] = gpus
        self._pg = ray.util.placement_group([dict(bundle) for _ in range(bundles)],
                                            strategy=strategy)
        self._own_pg = True
        ready, _ = ray.wait([self._pg.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            raise TimeoutError(
                f"tfring.ray: Ray could not reserve {bundles} x {bundle} ({strategy}) within "
                f"placement_group_timeout_s={self.settings.placement_group_timeout_s}; "
                f"available now: {ray.available_resources()}")

    # -------------------------------------------------------------- run ----

    def run(self, fn: Callable[..., Any], args: Optional[List] = None,
            kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Runs ``fn(*args, **kwargs)`` on every worker; returns the results
        in rank order, or raises WorkerError for the first rank that fails."""
        _no_callbacks(callbacks)
        return self._get(self.run_remote(fn, args, kwargs), self.workers, self._infos,
                         "running " + _name(fn))

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """Like run, but returns the ranks' object refs (rank order) at once."""
        self._require()
        return [w.run.remote(fn, list(args or ()), dict(kwargs or {})) for w in self.workers]

    def execute(self, fn: Callable[[Any], Any],
                callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Runs ``fn(executable)`` on every worker (the object of
        ``executable_cls``, else None); results in rank order."""
        _no_callbacks(callbacks)
        self._require()
        return self._get([w.execute.remote(fn) for w in self.workers], self.workers,
                         self._infos, "executing " + _name(fn))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """Runs ``fn(executable)`` on rank 0 only; returns its result."""
        self._require()
        return self._get([self.workers[0].execute.remote(fn)], self.workers[:1],
                         self._infos[:1], "executing " + _name(fn))[0]

    def shutdown(self):
        """Stops the workers (killing their processes), frees the placement
        group this executor created and stops the rendezvous store. start()
        may be called again."""
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers, self._infos = [], []
        self._failed = None
        if self._pg is not None and self._own_pg:
            try:
                ray.util.remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - already removed
                pass
        self._pg, self._own_pg = None, False
        if self._server is not None:
            self._server.stop()
            self._server = None

    # -------------------------------------------------------- internals ----

    def _require(self):
        if not self.workers:
            raise RuntimeError("RayExecutor: not started; call start() first")
        if self._failed is not None:
            # The survivors may still be in the failed job's collectives.
            raise RuntimeError(
                "RayExecutor: an earlier call failed, so the job's ranks are out of step; "
                f"call shutdown() and start() again. The failure: {self._failed}")

    def _get(self, refs, actors, infos, what, timeout=None):
        """The results of ``refs`` (one per rank, in rank order), taken as
        they finish, so the first failure is reported at once whichever
        rank it is; ``timeout`` bounds the whole wait.

        A rank that dies makes its peers' collectives fail too, naming it,
        and the peers' errors may reach the driver before Ray reports the
        death: failures that follow the first within FAILURE_GRACE_S are
        gathered, and a dead actor is named first as the likely cause."""
        index = {ref: i for i, ref in enumerate(refs)}
        results = [None] * len(refs)
        failures = []
        pending = list(refs)
        grace_end = None
        while pending:
            wait = timeout
            if grace_end is not None:
                wait = max(0.0, grace_end - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=wait)
            if not ready:
                if failures:
                    break
                late = sorted(index[r] for r in pending)
                raise TimeoutError(
                    f"tfring.ray: worker(s) {late} did not finish {what} within {timeout} s "
                    f"(Ray could not start them? available: {ray.available_resources()})")
            i = index[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                failures.append((i, e))
                if grace_end is None:
                    grace_end = time.monotonic() + FAILURE_GRACE_S
        if failures:
            died = [f for f in failures if isinstance(f[1], ray.exceptions.RayActorError)]
            i, e = (died or failures)[0]
            others = [(j, x) for j, x in failures if j != i]
            self._failed = _worker_error(e, i, len(refs), actors[i],
                                         infos[i] if infos else None, what, others)
            raise self._failed from e
        return results


def _detail(err):
    if isinstance(err, ray.exceptions.RayActorError):
        cause = str(err).strip().splitlines()
        return f"its actor died ({cause[0] if cause else type(err).__name__})"
    inner = getattr(err, "cause", None)
    if inner is not None:
        return f"raised {type(inner).__name__}: {inner}"
    return f"raised: {str(err).strip().splitlines()[-1]}"


def _worker_error(err, rank, size, actor, info, what, others=()):
    who = "rank" if info is not None else "worker"
    where = f"actor {actor._actor_id.hex()[:16]}"
    if info is not None:
        where += f", pid {info['pid']}, node {info['node_id'][:16]} ({info['ip']})"
    message = f"tfring.ray: {who} {rank} of {size} ({where}) failed {what}: {_detail(err)}"
    for j, other in others:
        message += f"\n  then {who} {j}: {_detail(other)}"
    return WorkerError(message, rank, actor._actor_id.hex(), info and info["node_id"],
                       info and info["ip"], info and info["pid"])


def _no_callbacks(callbacks):
    if callbacks:
        warnings.warn("tfring.ray.RayExecutor: callbacks are not called (as in Horovod's "
                      "non-elastic RayExecutor); return values from the function instead",
                      RuntimeWarning, stacklevel=3)


def _name(fn):
    return getattr(fn, "__qualname__", None) or repr(fn)
