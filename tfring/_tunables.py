"""Every TFRING_* environment variable, in one place.

The core's tunables are declared once, in csrc/common/tunables.cc, and read
here from ``tfring._core.tunables()``; the ones only Python reads (the
launcher's, the elastic driver's) are declared in ``PYTHON`` below.
docs/tunables.md documents every entry with the
same default (tests/core/test_tunables.py holds them together).

``table()`` merges both (the core's part loads the native core, so the
launcher, which must run without it, reads Python-only tunables without
loading it). A value comes from, first match wins: the configuration of the init in
progress (``configure``: HOROVOD_* variables read as TFRING_* ones, the
elastic worker's defaults), the environment, the declared default. The
core gets that configuration as ``_core.init(..., config=core_config())``;
nothing here writes ``os.environ``, which stays the way in for launchers
and users.
"""

import collections
import os

__all__ = ["PYTHON", "Tunable", "configure", "core_config", "default", "get", "is_set", "raw",
           "set_default", "table"]

Tunable = collections.namedtuple(
    "Tunable", "name type default choices min max launcher doc core")

_INF = float("inf")


def _py(name, type_, default="", doc="", choices=None, launcher=False):
    lo, hi = (None, None) if type_ in ("enum", "string", "bool") else (0.0, _INF)
    return Tunable(name, type_, default, tuple(choices) if choices else None, lo, hi,
                   launcher, doc, False)


# Read only by Python. Defaults as documented ("" is unset).
PYTHON = (
    _py("TFRING_BIND", "enum", "auto", choices=("auto", "none"),
        doc="tfring-run, mpirun_command, tfring.spark and tfring.ray: bind each local rank "
            "to its own cores"),
    _py("TFRING_DISCOVERY_TIMEOUT", "seconds", "10",
        doc="elastic mode: seconds one run of the host discovery script may take"),
    _py("TFRING_ELASTIC_REPORT_GRACE", "seconds", "5",
        doc="elastic mode: seconds the other members have to report a collective error"),
    _py("TFRING_ELASTIC_JOIN_TIMEOUT", "seconds", "600",
        doc="elastic workers: seconds init waits for a membership (tfring-run sets it)"),
    _py("TFRING_DYNAMIC_PROCESS_SETS", "bool", "0",
        doc="accepted for Horovod's HOROVOD_DYNAMIC_PROCESS_SETS; sets can always be added"),
    _py("TFRING_MPIRUN", "string", doc="the mpirun that tests and benchmarks use"),
    _py("TFRING_SECRET", "string",
        doc="job secret for the connection handshake, the same on every rank"),
    # Set per rank by the launcher (tfring-run, the elastic driver).
    _py("TFRING_RANK", "int", launcher=True, doc="this rank"),
    _py("TFRING_LOCAL_RANK", "int", launcher=True, doc="rank among the ranks on this host"),
    _py("TFRING_CROSS_RANK", "int", launcher=True, doc="index of this host"),
    _py("TFRING_CROSS_SIZE", "int", launcher=True, doc="number of hosts"),
    _py("TFRING_STORE_ADDR", "string", launcher=True, doc="host:port of the rendezvous store"),
    _py("TFRING_FILE_STORE", "string", launcher=True,
        doc="a directory store (one host) instead of TFRING_STORE_ADDR"),
    _py("TFRING_RESTART", "int", launcher=True, doc="which start of the job this is"),
    _py("TFRING_ELASTIC_ID", "int", launcher=True, doc="an elastic worker's id"),
    _py("TFRING_HOROVOD_SEEN", "string", launcher=True,
        doc="HOROVOD_* names tfring-run already reported"),
)

# In elastic workers these core tunables default differently (unless set):
# a rendezvous or collective stuck on a peer that vanished fails sooner.
ELASTIC_WORKER_DEFAULTS = {"TFRING_TIMEOUT": "30"}


_PYTHON = {t.name: t for t in PYTHON}
_table = None


def table():
    """{name: Tunable} of every tunable, the core's first (in their
    declaration order)."""
    global _table
    if _table is None:
        from tfring import _core

        core = [Tunable(d["name"], d["type"], d["default"],
                        tuple(d["choices"]) if "choices" in d else None,
                        d.get("min"), d.get("max"), d["launcher"], d["doc"], True)
                for d in _core.tunables()]
        both = collections.OrderedDict((t.name, t) for t in (*core, *PYTHON))
        if len(both) != len(core) + len(PYTHON):
            raise RuntimeError("a tunable is declared both in the core and in Python")
        _table = both
    return _table

_config = {}  # the configuration of the init in progress: TFRING name -> text


def configure(config):
    """Replaces the configuration of the init in progress (TFRING name ->
    value); every name must be declared."""
    global _config
    config = {k: str(v) for k, v in (config or {}).items()}
    for k in config:
        _declared(k)
    _config = config


def set_default(name, value):
    """Adds ``name=value`` to the configuration unless it is set already
    (configuration or environment)."""
    _declared(name)
    if not is_set(name):
        _config[name] = str(value)


def core_config():
    """The configuration's core tunables: init's ``config`` argument."""
    return {k: v for k, v in _config.items() if k not in _PYTHON}


def _declared(name):
    t = _PYTHON.get(name) or table().get(name)
    if t is None:
        raise KeyError(f"{name} is not a declared tunable (tfring/_tunables.py, "
                       "csrc/common/tunables.cc)")
    return t


def raw(name):
    """The text of ``name`` (configuration, then environment), "" when unset."""
    _declared(name)
    return _config.get(name) or os.environ.get(name, "")


def is_set(name):
    return raw(name) != ""


def default(name):
    """The declared default of ``name``, typed as ``get`` returns it."""
    t = _declared(name)
    return _parse(t, t.default) if t.default != "" else None


def get(name):
    """The typed value of ``name``: int (int, bytes), float (seconds,
    milliseconds), bool, or str (enum, string); None when unset without a
    default. A bad value raises ValueError naming the variable and what it
    accepts (TfringError from the core for the core's tunables)."""
    t = _declared(name)
    if t.core:
        from tfring import _core

        return _core.tunable_value(name, core_config())
    v = raw(name)
    if v == "":
        return default(name)
    return _parse(t, v)


def _parse(t, v):
    text = v.strip()
    if t.type == "enum":
        if text.lower() not in t.choices:
            raise ValueError(f"{t.name}={v} is not one of {', '.join(t.choices)}")
        return text.lower()
    if t.type == "string":
        return v
    if t.type == "bool":
        if text.lower() in ("true", "yes", "on"):
            return True
        if text.lower() in ("false", "no", "off"):
            return False
        try:
            return int(text) != 0
        except ValueError:
            raise ValueError(f"{t.name}={v} is not one of 0, 1") from None
    try:
        x = int(text) if t.type == "int" else float(text)
    except ValueError:
        what = "an integer" if t.type == "int" else f"a number of {t.type}"
        raise ValueError(f"{t.name}={v} is not {what}") from None
    if not t.min <= x <= t.max:
        raise ValueError(f"{t.name}={v} is out of range (at least {t.min:g})")
    return x
