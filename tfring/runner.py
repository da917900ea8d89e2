"""tfring.runner.run: Horovod's ``horovod.run`` (``horovod.runner.run``), a
Python function run as a job.

    import tfring.runner as hvd_runner       # was: import horovod (horovod.run)

    def train(lr):
        import tfring as hvd
        hvd.init()
        ...
        return hvd.rank(), final_loss

    results = hvd_runner.run(train, args=(0.01,), np=2)   # [rank 0's, rank 1's]

The ranks start as ``tfring-run`` starts them (tfring/run/launcher.py): local
ranks as children of this process, remote ones over ssh, every rank with the
TFRING_* variables ``tfring.init()`` reads and the job's rendezvous store
hosted here. The function, its arguments and its results travel through
that store (tfring/run/fn_job.py). Also reachable as ``tfring.run_fn``.
"""

import os
import sys
import warnings

from tfring.run import fn_job
from tfring.run.common import EXIT_TIMEOUT, signal_name

__all__ = ["RankFailedError", "StartTimeoutError", "run", "run_fn"]

RankFailedError = fn_job.RankFailedError
StartTimeoutError = fn_job.StartTimeoutError
DEFAULT_START_TIMEOUT_S = 30.0  # horovodrun's default


class _Driver:
    """The launcher's hooks (launcher._run_once's ``driver``): publish the
    payload once the store is up, collect the results once the ranks end."""

    def __init__(self, payload, size, start_timeout_s):
        self.payload = payload
        self.size = size
        self.start_timeout_s = start_timeout_s
        self.watch = None
        self.results = None
        self.error = None
        self.job = None

    def store_ready(self, host, port, secret):
        from tfring import _core

        host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host.strip("[]")
        self.store = _core.TcpStore(host, port, secret, 10.0)
        self.store.set(fn_job.PAYLOAD_KEY, self.payload)
        self.watch = fn_job.StartWatch(self.store, self.size, self.start_timeout_s)
        return self.watch

    def job_ended(self, job, code):
        self.job = job
        deaths = {}
        for rank, rc in job.returncodes.items():
            if rc < 0:
                deaths[rank] = f"was killed by signal {signal_name(-rc)}"
            elif rc != 0:
                deaths[rank] = f"exited with code {rc}"
        first = job.failure[0] if job.failure else None
        try:
            self.results = fn_job.collect(self.store, self.size, deaths, first)
        except fn_job.RankFailedError as e:
            self.error = e


def _parser():
    from tfring.run import launcher

    parser = launcher.build_parser()

    def error(message):
        raise ValueError(message)

    parser.error = error
    return parser


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None,
        output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None, max_np=None, *,
        timeout=None):
    """Runs ``func(*args, **kwargs)`` on ``num_proc`` ranks; returns the list of
    its return values, index = rank.

    Horovod's parameters with its meaning (docs/from-horovod.md, "Functions
    as jobs"); ``np``/``min_np``/``max_np`` are its deprecated spellings of
    ``num_proc``/``min_num_proc``/``max_num_proc``. ``timeout`` (tfring's):
    seconds the whole job may run, then ``TimeoutError``.

    A rank that raises fails the call with ``RankFailedError`` naming the
    rank, with the remote traceback in its message (and the exception in
    ``.exception`` when it unpickles here); a rank killed by a signal fails
    it naming the rank and the signal; ranks that do not start within
    ``start_timeout`` seconds (default HOROVOD_START_TIMEOUT, else 30) fail
    it with ``StartTimeoutError`` naming them."""
    if np is not None:
        if num_proc == 1:
            num_proc = np
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, 2)
    if min_np is not None:
        min_num_proc = min_num_proc if min_num_proc is not None else min_np
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, 2)
    if max_np is not None:
        max_num_proc = max_num_proc if max_num_proc is not None else max_np
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, 2)
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    if use_mpi:
        raise ValueError("use_mpi=True: a function job's results travel through the "
                         "store tfring-run hosts, so its ranks are started by tfring "
                         "itself; leave use_mpi unset (mpi_args then has no effect)")
    if any(v not in (None, num_proc) for v in (min_num_proc, max_num_proc)):
        raise NotImplementedError(
            "min_num_proc/max_num_proc other than num_proc: elastic function jobs are "
            "not supported; run an elastic script with tfring-run --min-np/--max-np "
            "(docs/elastic.md)")
    if not callable(func):
        raise TypeError(f"func must be callable, got {func!r}")
    if start_timeout is None:
        env = os.environ.get("HOROVOD_START_TIMEOUT")  # as horovodrun reads it
        try:
            start_timeout = float(env) if env else DEFAULT_START_TIMEOUT_S
        except ValueError:
            raise ValueError(f"HOROVOD_START_TIMEOUT must be a number of seconds, got "
                             f"{env!r}") from None

    argv = ["-np", str(int(num_proc))]
    if hosts:
        argv += ["-H", hosts]
    if hostfile:
        argv += ["--hostfile", os.fspath(hostfile)]
    if ssh_port:
        argv += ["-p", str(int(ssh_port))]
    if ssh_identity_file:
        argv += ["--ssh-identity-file", os.fspath(ssh_identity_file)]
    if output_filename:
        argv += ["--output-filename", os.fspath(output_filename)]
    if verbose:
        argv += ["--verbose"]
    if network_interface:
        argv += ["--network-interface", network_interface]
    if timeout is not None:
        argv += ["--timeout", str(float(timeout))]
    argv += ["--", executable or sys.executable, "-m", "tfring.run.fn_job"]

    from tfring.run import horovodrun, launcher

    parser = _parser()
    parsed = parser.parse_args(argv)
    horovodrun.check_args(parser, parsed)
    if parsed.np < 1:
        raise ValueError(f"num_proc must be >= 1, got {num_proc}")
    tunables = horovodrun.launcher_tunables(parsed, sys.stderr)
    driver = _Driver(fn_job.serialize(func, args, kwargs), parsed.np, start_timeout)
    with horovodrun.environ(tunables):
        code, _ = launcher._run_once(parser, parsed, 0, driver)
    return _outcome(driver, code, timeout)


def _outcome(driver, code, timeout):
    watch = driver.watch
    if watch is not None and watch.missing:
        raise StartTimeoutError(
            f"function job: rank(s) {', '.join(map(str, watch.missing))} did not start "
            f"within {watch.timeout_s:g} s (start_timeout)", watch.missing)
    if code == EXIT_TIMEOUT and timeout is not None and (
            driver.error is None or driver.error.remote_traceback is None):
        raise TimeoutError(f"function job ran longer than {timeout:g} s (timeout)")
    if driver.job is not None and driver.job.signals_received:
        raise RuntimeError(f"function job stopped: this process was signalled "
                           f"(exit code {code})")
    if driver.error is not None:
        raise driver.error
    if driver.results is None:  # pragma: no cover - the launcher always reports
        raise RuntimeError(f"function job ended with exit code {code} and no results")
    return driver.results


run_fn = run
