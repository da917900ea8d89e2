"""The worker's side of elastic membership (tfring-run --min-np/--max-np).

The elastic driver (tfring/run/elastic.py) owns the job's rendezvous store
and decides who is in the job. It publishes each membership as an *epoch*:

    elastic/epoch          the newest epoch number (overwritten)
    elastic/epoch.<e>      JSON {"epoch", "members": [worker ids in rank
                           order], "hosts": [host of each member], "token",
                           "added": new members joined, "reason"}; or
                           {"epoch", "abort": why} when the driver gives up

A worker (a process the driver started, TFRING_ELASTIC_ID in its
environment) takes part like this:

  * its first init() announces it: ``elastic/ready.<id>``;
  * init() waits for an epoch newer than the last one it joined that lists
    it, announces its arrival (counter ``elastic/arrived.<e>``) and waits
    for every member to arrive (``elastic/complete.<e>``), so the core's
    rendezvous starts only with every member present; an epoch superseded
    before every member arrived is dead (``elastic/dead.<e>``) and its
    members move on to the newest (see _arrive);
  * rank = the index of its id in "members"; the core rendezvouses under the
    store prefix ``elastic/e<e>/`` with the secret ``<job secret>:<token>``,
    so nothing of an earlier epoch (keys, stale peers) can join this one;
  * a collective error is reported (counter ``elastic/failed.<e>`` and
    ``elastic/failmsg.<e>.<id>``) so the driver re-forms the job even when
    no process died (a cut link, a hung peer);
  * check_host_updates() compares ``elastic/epoch`` with the joined epoch.

A worker left out of a newer epoch after being a member was removed (its
host went away or was blacklisted): init() raises RemovedFromJobError.
"""

import json
import os
import time

from tfring import _bootstrap, _core, _tunables

PREFIX = "elastic/"
POISON = 1 << 40  # see _arrive


class RemovedFromJobError(RuntimeError):
    """This process is not part of the job's newest membership."""


class _Worker:
    def __init__(self):
        self.wid = int(os.environ["TFRING_ELASTIC_ID"])
        self.secret = os.environ.get("TFRING_SECRET", "")
        self.addr = os.environ["TFRING_STORE_ADDR"]
        self.join_timeout = _tunables.get("TFRING_ELASTIC_JOIN_TIMEOUT")
        self.control = _bootstrap._connect(self.addr, self.secret)
        self.epoch = -1  # the epoch joined last
        self.record = None
        self.announced = False
        self.core_store = None

    # ------------------------------------------------------------ store --
    def latest(self):
        if not self.control.check([PREFIX + "epoch"]):
            return -1
        return int(self.control.get(PREFIX + "epoch", 5.0))

    def read(self, e):
        return json.loads(self.control.get(f"{PREFIX}epoch.{e}", 30.0))

    # ------------------------------------------------------------- join --
    def join(self):
        if not self.announced:
            self.control.set(f"{PREFIX}ready.{self.wid}", str(os.getpid()).encode())
            self.announced = True
        deadline = time.monotonic() + self.join_timeout
        seen = self.epoch
        while True:
            e = self.latest()
            if e > seen:
                seen = e
                rec = self.read(e)
                if "abort" in rec:
                    raise RuntimeError(f"tfring elastic: the job was stopped: {rec['abort']}")
                if self.wid in rec["members"]:
                    if self._arrive(e, rec):
                        try:
                            self._init(e, rec)
                            return
                        except _core.TfringError:
                            # A member vanished during the rendezvous: the
                            # driver publishes a newer epoch (see report_failure).
                            _core.shutdown()
                elif self.epoch >= 0:
                    raise RemovedFromJobError(
                        f"tfring elastic: worker {self.wid} is not in membership epoch {e} "
                        f"({rec.get('reason', 'no reason given')}); leaving")
            if time.monotonic() > deadline:
                raise _core.TfringTimeoutError(
                    f"tfring elastic: worker {self.wid} found no membership to join within "
                    f"{self.join_timeout:g} s (TFRING_ELASTIC_JOIN_TIMEOUT); last epoch "
                    f"seen {seen}")
            time.sleep(0.005)

    def _arrive(self, e, rec):
        """Waits until every member of epoch e arrived (True), or until e is
        dead (False): a newer epoch was published before all arrived.

        One atomic counter decides, so every member decides alike: arrivals
        add 1, and whoever gives up on e (a member that sees a newer epoch,
        the driver after a death) adds POISON. The add that takes the count
        to exactly the size marks e complete; a first poison that finds it
        short marks e dead. A poison after completion changes nothing."""
        key, size = f"{PREFIX}arrived.{e}", len(rec["members"])
        if self.control.add(key, 1) == size:
            self.control.set(f"{PREFIX}complete.{e}", b"1")
            return True
        while True:
            if self.control.check([f"{PREFIX}complete.{e}"]):
                return True
            if self.control.check([f"{PREFIX}dead.{e}"]):
                return False
            if self.latest() > e:
                v = self.control.add(key, POISON)
                if POISON <= v < POISON + size:
                    self.control.set(f"{PREFIX}dead.{e}", b"1")
                    return False
                if v == POISON + size:
                    return True
            time.sleep(0.002)

    def _init(self, e, rec):
        members, hosts = rec["members"], rec["hosts"]
        rank = members.index(self.wid)
        mine = hosts[rank]
        same = [i for i, h in enumerate(hosts) if h == mine]
        env = {"TFRING_RANK": rank, "TFRING_SIZE": len(members),
               "TFRING_LOCAL_RANK": same.index(rank), "TFRING_LOCAL_SIZE": len(same)}
        for k, v in env.items():  # for scripts (and horovod names) that read them
            os.environ[k] = os.environ["HOROVOD" + k[6:]] = str(v)
        store = _core.PrefixStore(f"{PREFIX}e{e}/", _bootstrap._connect(self.addr, self.secret))
        self.core_store = store
        self.record = rec
        self.epoch = e
        try:
            _core.init(rank, len(members), store, f"{self.secret}:{rec['token']}",
                       config=_tunables.core_config())
        except Exception as err:
            self.report_failure(err)
            raise

    # ----------------------------------------------------------- events --
    def report_failure(self, err):
        if self.epoch < 0:
            return
        try:
            self.control.set(f"{PREFIX}failmsg.{self.epoch}.{self.wid}",
                             str(err).encode()[:2000])
            self.control.add(f"{PREFIX}failed.{self.epoch}", 1)
        except Exception:  # noqa: BLE001 - the driver also sees deaths itself
            pass

    def update_pending(self):
        """(newer epoch published, it adds members) as this process sees it."""
        e = self.latest()
        if e <= self.epoch:
            return False, False
        try:
            rec = self.read(e)
        except Exception:  # noqa: BLE001 - treat as a pending update
            return True, True
        return True, bool(rec.get("added", True))


_worker = None


def active():
    """True in a process started by the elastic driver."""
    return bool(os.environ.get("TFRING_ELASTIC_ID"))


def worker():
    global _worker
    if _worker is None:
        _worker = _Worker()
    return _worker


def join():
    """tfring.init() in an elastic worker: joins the newest membership."""
    for name, value in _tunables.ELASTIC_WORKER_DEFAULTS.items():
        _tunables.set_default(name, value)
    worker().join()
