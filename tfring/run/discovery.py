"""Host discovery for the elastic driver (horovodrun's --host-discovery-script).

The script prints one host per line, ``host:slots`` or ``host`` (then
--slots-per-host slots). A script that fails (exit code), hangs (past the
timeout) or prints anything else raises DiscoveryError with the reason; the
driver then keeps the hosts it knew.
"""

import contextlib
import os
import signal
import subprocess

from tfring import _tunables

DEFAULT_TIMEOUT_S = _tunables.default("TFRING_DISCOVERY_TIMEOUT")


class DiscoveryError(RuntimeError):
    pass


def parse_output(text, slots_per_host, script="discovery script"):
    """'a:2\\nb\\n' -> {'a': 2, 'b': slots_per_host}, in order."""
    hosts = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        host, sep, slots = line.rpartition(":") if line.count(":") == 1 else (line, "", "")
        if not sep:
            host, slots = line, ""
        bad = (not host or any(c.isspace() for c in host)
               or (slots and not slots.isdigit()))
        if bad:
            raise DiscoveryError(f"{script} printed {raw!r} on line {number}; expected "
                                 "'host:slots' or 'host'")
        n = int(slots) if slots else slots_per_host
        if n is None:
            raise DiscoveryError(f"{script} printed {raw!r} on line {number} without slots "
                                 "and --slots-per-host is not given")
        if n < 1:
            raise DiscoveryError(f"{script} printed {raw!r} on line {number}: slots must "
                                 "be >= 1")
        hosts[host] = hosts.get(host, 0) + n
    return hosts


def discover(script, slots_per_host, timeout_s=None):
    """Runs the script once; returns {host: slots}. It may run timeout_s
    (default TFRING_DISCOVERY_TIMEOUT, else 10 s)."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("TFRING_DISCOVERY_TIMEOUT", DEFAULT_TIMEOUT_S))
    try:
        # A session of its own: a hung script's children are killed with it.
        proc = subprocess.Popen(script, shell=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as e:
        raise DiscoveryError(f"host discovery script {script!r} cannot run: {e}") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        raise DiscoveryError(f"host discovery script {script!r} did not finish within "
                             f"{timeout_s:g} s") from None
    if proc.returncode != 0:
        err = stderr.decode("utf-8", "replace").strip().splitlines()
        raise DiscoveryError(f"host discovery script {script!r} exited with code "
                             f"{proc.returncode}" + (f": {err[-1]}" if err else ""))
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise DiscoveryError(f"host discovery script {script!r} printed bytes that are "
                             "not UTF-8") from None
    return parse_output(text, slots_per_host, f"host discovery script {script!r}")
