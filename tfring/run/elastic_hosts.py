"""The elastic driver's hosts: which hosts exist and how many slots each
has (from -H / --hostfile / -np, or a discovery script polled in a thread),
and which may take workers now (a failed host is blacklisted for good, or
for a cool-down that doubles with each failure when
--blacklist-cooldown-range is given).

The driver (tfring/run/elastic.py) asks `usable(host)` before it starts a
worker, tells `failed(host, why)` when a host's worker fails, and applies
`take_discovery()`'s changes to its workers."""

import math
import threading
import time

from tfring.run import discovery
from tfring.run.common import parse_hosts
from tfring.run.hostfile import parse_hostfile

DISCOVERY_INTERVAL_S = 1.0
REMOVED = "removed by host discovery"


class HostPool:
    def __init__(self, args, log, default_np):
        self.args, self.log = args, log
        self.default_np = default_np
        self.hosts = {}  # host -> slots, from discovery or -H
        self.lost = {}  # host -> why it is not usable now
        self.failures = {}  # host -> failures so far
        self.blacklist = {}  # host -> readmission time (inf: never)
        self.discovered = None  # newest result of the discovery thread
        self.discovery_lock = threading.Lock()
        self.stop_event = threading.Event()
        self.watcher = None

    # -------------------------------------------------------- discovery --
    def start(self):
        """Reads the first host list; starts the discovery thread if a
        script lists the hosts."""
        a = self.args
        if not a.host_discovery_script:
            self.hosts = self._static_hosts()
            return
        try:
            self.hosts = discovery.discover(a.host_discovery_script, a.slots_per_host)
        except discovery.DiscoveryError as e:
            self.log(f"error: {e}; waiting for the script to list hosts")
        self.watcher = threading.Thread(target=self._discover_loop, daemon=True,
                                        name="host-discovery")
        self.watcher.start()

    def stop(self):
        self.stop_event.set()

    def _static_hosts(self):
        a = self.args
        if a.hostfile:
            return dict(parse_hostfile(a.hostfile))
        if a.hosts:
            merged = {}
            for h, n in parse_hosts(a.hosts):
                merged[h] = merged.get(h, 0) + n
            return merged
        return {"localhost": self.default_np}

    def _discover_loop(self):
        script, slots = self.args.host_discovery_script, self.args.slots_per_host
        last_error = None
        while not self.stop_event.is_set():
            try:
                hosts = discovery.discover(script, slots)
                with self.discovery_lock:
                    self.discovered = hosts
                if last_error:
                    self.log("host discovery works again")
                last_error = None
            except discovery.DiscoveryError as e:
                if str(e) != last_error:
                    self.log(f"error: {e}; keeping the current hosts")
                last_error = str(e)
            self.stop_event.wait(DISCOVERY_INTERVAL_S)

    def take_discovery(self):
        """Applies the newest discovery result. Returns the hosts whose
        workers may now be too many, as {host: slots now (0: removed)}."""
        with self.discovery_lock:
            found, self.discovered = self.discovered, None
        if found is None or found == self.hosts:
            return {}
        added = [h for h in found if h not in self.hosts]
        removed = [h for h in self.hosts if h not in found]
        changed = [h for h in found if h in self.hosts and found[h] != self.hosts[h]]
        self.log("discovery: " + ", ".join(
            [f"host {h} added ({found[h]} slots)" for h in added]
            + [f"host {h} removed" for h in removed]
            + [f"host {h} now has {found[h]} slots" for h in changed]))
        self.hosts = found
        for h in removed:
            self.lost[h] = REMOVED
        for h in found:
            if self.lost.get(h) == REMOVED:
                del self.lost[h]
        return {h: found.get(h, 0) for h in set(removed) | set(changed)}

    # --------------------------------------------------------- blacklist --
    def usable(self, host, now):
        until = self.blacklist.get(host)
        if until is None:
            return True
        if now < until:
            return False
        del self.blacklist[host]
        self.lost.pop(host, None)
        self.log(f"host {host} readmitted after its blacklist cool-down")
        return True

    def failed(self, host, why):
        """Blacklists `host` after a failure there."""
        n = self.failures[host] = self.failures.get(host, 0) + 1
        rng = self.args.cooldown_range
        if rng:
            cool = min(rng[1], rng[0] * 2 ** (n - 1))
            self.blacklist[host] = time.monotonic() + cool
            how = f"for {cool:g} s"
        else:
            self.blacklist[host] = math.inf
            how = "for the rest of the job (no --blacklist-cooldown-range)"
        self.lost[host] = f"blacklisted after {n} failure(s), last: {why}"
        self.log(f"host {host} blacklisted {how} ({n} failure(s)): {why}")

    def none_admissible(self):
        """True when every known host is blacklisted for good: a cool-down
        ends, and discovery may list a new host, so both are worth waiting
        for."""
        return bool(self.hosts) and all(self.blacklist.get(h) == math.inf for h in self.hosts)

    def describe_lost(self):
        return "; ".join(f"{h}: {why}" for h, why in sorted(self.lost.items())) or "none"

    def describe(self):
        return ", ".join(f"{h}:{n}" for h, n in self.hosts.items())
