"""The tunables table (csrc/common/tunables.cc, tfring/_tunables.py): the
docs page agrees with it, nothing reads a TFRING_* variable around it, bad
values are errors naming the variable, and init's config argument takes
precedence over the environment without editing it."""

import json
import os
import re
import subprocess
import sys

import pytest

from tfring import _core, _tunables

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(REPO, "docs", "tunables.md")


def _doc_rows():
    """{name: (default cell or None, row text)} of every table row whose
    first cell names TFRING_* variables (several in one cell: launcher rows)."""
    rows = {}
    with open(DOC) as f:
        for line in f:
            if not line.startswith("| `TFRING_"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            default = cells[1] if len(cells) >= 3 else None
            for name in re.findall(r"`(TFRING_[A-Z0-9_]+)`", cells[0]):
                assert name not in rows or rows[name][0] is None or default is None, \
                    f"{name} has two rows with a default in docs/tunables.md"
                if name not in rows or default is not None:
                    rows[name] = (default, line)
    return rows


def test_every_tunable_documented_with_its_default():
    rows = _doc_rows()
    for t in _tunables.table().values():
        assert t.name in rows, f"{t.name} is not in docs/tunables.md"
        default, line = rows[t.name]
        if t.launcher and default is None:
            continue  # the launcher's table has no default column
        assert default is not None, f"{t.name} has no default in docs/tunables.md"
        first = re.findall(r"`([^`]*)`", default)
        if t.default == "":
            assert not first, f"{t.name} is unset by default, the docs say {default!r}"
        else:
            assert first and first[0] == t.default, \
                f"{t.name}: the table's default is {t.default!r}, the docs say {default!r}"
        for choice in t.choices or ():
            assert f"`{choice}`" in line, f"{t.name}: choice {choice!r} is not documented"


def test_elastic_worker_defaults_documented():
    rows = _doc_rows()
    for name, value in _tunables.ELASTIC_WORKER_DEFAULTS.items():
        assert f"`{value}` in elastic workers" in rows[name][0], rows[name]


def test_every_documented_variable_is_declared():
    table = _tunables.table()
    for name in _doc_rows():
        assert name in table, f"docs/tunables.md documents {name}, which nothing declares"


def test_core_table_is_well_formed():
    types = {"int", "bytes", "seconds", "milliseconds", "bool", "enum", "string"}
    names = [d["name"] for d in _core.tunables()]
    assert len(names) == len(set(names))
    for d in _core.tunables():
        assert d["type"] in types and d["doc"], d
        if d["type"] == "enum":
            assert d["choices"] and (d["default"] == "" or d["default"] in d["choices"]), d
        # The default parses (an empty environment gives it back).
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
    code = ("import json; from tfring import _core\n"
            "print(json.dumps({d['name']: _core.tunable_value(d['name'])"
            " for d in _core.tunables()}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    values = json.loads(out.stdout)
    assert values["TFRING_FUSION_THRESHOLD"] == 64 << 20
    assert values["TFRING_TIMEOUT"] == 300.0
    assert values["TFRING_CACHE"] is True
    assert values["TFRING_ALLREDUCE_ALGO"] == "auto"
    assert values["TFRING_TIMELINE"] is None


# ------------------------------------------------------- no reads around it --

def _sources(root, exts):
    for dirpath, _, files in os.walk(os.path.join(REPO, root)):
        for f in files:
            if f.endswith(exts):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, REPO), open(path, encoding="utf-8").read()


def test_no_getenv_outside_the_table_in_csrc():
    found = []
    for rel, text in _sources("csrc", (".cc", ".h", ".cu", ".cuh")):
        if rel == os.path.join("csrc", "common", "tunables.cc"):
            continue
        # Code only: comments may name getenv.
        text = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                      flags=re.S)
        for m in re.finditer(r"\b(secure_getenv|getenv|environ)\b", text):
            line = text[:m.start()].count("\n") + 1
            found.append(f"{rel}:{line}")
    assert not found, "getenv outside csrc/common/tunables.cc: " + ", ".join(found)


# Python files that may touch TFRING_* in os.environ directly, and why.
PY_ALLOWED = {
    # Runs at `import tfring`, which must not load the native core; only
    # compares with a choice.
    "tfring/__init__.py",
    # The launcher sets its ranks' environment (the way in for them), and
    # runs without the native core.
    "tfring/run/",
    # Exports the membership's rank and size for user scripts (and
    # Horovod's names), as a launcher would.
    "tfring/elastic/_worker.py",
}


def test_python_reads_tunables_through_the_table():
    reads, literals = [], []
    read = re.compile(r"""os\.(environ\.get|environ\.setdefault|getenv)\(\s*["'](TFRING_\w+)["']"""
                      r"""|os\.environ\[\s*["'](TFRING_\w+)["']\s*\]""")
    literal = re.compile(r"""(environ\.get|getenv|setdefault)\(\s*["']TFRING_\w+["']\s*,\s*"""
                         r"""(["'][^"']+["']|[-+.\d])""")
    for rel, text in _sources("tfring", (".py",)):
        if rel == os.path.join("tfring", "_tunables.py"):
            continue
        for m in literal.finditer(text):
            literals.append(f"{rel}:{text[:m.start()].count(chr(10)) + 1}")
        if any(rel.startswith(a) for a in PY_ALLOWED):
            continue
        for m in read.finditer(text):
            reads.append(f"{rel}:{text[:m.start()].count(chr(10)) + 1}")
    assert not reads, "TFRING_* read around tfring/_tunables.py: " + ", ".join(reads)
    assert not literals, "a TFRING_* default repeated outside the table: " + ", ".join(literals)


# ----------------------------------------------------------------- values --

def _run(code, env_extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFRING_", "HOROVOD_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("name,value,says", [
    ("TFRING_CHUNK_SIZE", "12Q", "is not a size in bytes"),
    ("TFRING_CHUNK_SIZE", "4", "is out of range (at least 8)"),
    ("TFRING_SMALL_THRESHOLD", "1G", "is out of range (from 0 to 256M)"),
    ("TFRING_TIMEOUT", "soon", "is not a number of seconds"),
    ("TFRING_LOG_LEVEL", "7", "is out of range (from 0 to 3)"),
    ("TFRING_CACHE", "maybe", "is not one of 0, 1"),
    ("TFRING_ALLREDUCE_ALGO", "fastest",
     "is not one of auto, ring, oneshot, hier, recdbl, rabenseifner"),
    # Read at the first GPU collective, checked at init all the same.
    ("TFRING_GPU_BACKEND", "mpi", "is not one of auto, nccl, ring"),
])
def test_bad_value_is_an_error_at_init(name, value, says):
    out = _run("from tfring import _core\n"
               "try:\n    _core.init()\n"
               "except _core.TfringError as e:\n"
               "    print('ERR', e, '|', _core.is_initialized())\n", {name: value})
    assert out.returncode == 0, out.stderr
    assert f"ERR {name}={value} {says}" in out.stdout, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("| False"), out.stdout  # nothing was started


def test_bad_override_names_the_variable_and_unknown_names_are_refused():
    with pytest.raises(_core.TfringError, match=r"TFRING_VOTE_ALGO=fast is not one of "
                                                r"auto, ring, recdbl, host"):
        _core.tunable_value("TFRING_VOTE_ALGO", {"TFRING_VOTE_ALGO": "fast"})
    with pytest.raises(_core.TfringError, match="TFRING_NO_SUCH is not a tunable of the core"):
        _core.tunable_value("TFRING_TIMEOUT", {"TFRING_NO_SUCH": "1"})
    assert _core.tunable_value("TFRING_FUSION_THRESHOLD", {"TFRING_FUSION_THRESHOLD": "3M"}) \
        == 3 << 20
    assert _core.tunable_value("TFRING_ALLREDUCE_ALGO", {"TFRING_ALLREDUCE_ALGO": "RING"}) \
        == "ring"


def test_python_only_tunables_validate(monkeypatch):
    monkeypatch.setenv("TFRING_DISCOVERY_TIMEOUT", "later")
    with pytest.raises(ValueError, match="TFRING_DISCOVERY_TIMEOUT=later is not a number"):
        _tunables.get("TFRING_DISCOVERY_TIMEOUT")
    monkeypatch.setenv("TFRING_BIND", "cores")
    with pytest.raises(ValueError, match="TFRING_BIND=cores is not one of auto, none"):
        _tunables.get("TFRING_BIND")
    monkeypatch.delenv("TFRING_DISCOVERY_TIMEOUT")
    assert _tunables.get("TFRING_DISCOVERY_TIMEOUT") == 10.0
    with pytest.raises(KeyError, match="TFRING_NOPE is not a declared tunable"):
        _tunables.get("TFRING_NOPE")


def test_config_wins_over_environment_and_leaves_it_alone():
    code = ("import json, os; from tfring import _core\n"
            "_core.init(config={'TFRING_CYCLE_TIME': '3.5', 'TFRING_CACHE': '0'})\n"
            "c = _core.config()\n"
            "print('OUT', json.dumps([c['cycle_time_ms'], c['cache_enabled'], c['timeout_s'],"
            " os.environ['TFRING_CYCLE_TIME']]))\n"
            "_core.shutdown()\n"
            "_core.init()\n"  # the next init's configuration replaces it
            "print('OUT2', _core.config()['cycle_time_ms'])\n"
            "_core.shutdown()\n")
    out = _run(code, {"TFRING_CYCLE_TIME": "9", "TFRING_TIMEOUT": "42"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.split("OUT ", 1)[1].splitlines()[0])
    assert got == [3.5, False, 42.0, "9"]
    assert "OUT2 9.0" in out.stdout, out.stdout


def test_horovod_names_reach_the_core_as_config_not_environment():
    code = ("import os; import tfring.basics as b; from tfring import _core\n"
            "b.init()\n"
            "c = _core.config()\n"
            "print('OUT', c['cycle_time_ms'], c['fusion_threshold'],"
            " 'TFRING_CYCLE_TIME' in os.environ, 'TFRING_FUSION_THRESHOLD' in os.environ)\n"
            "b.shutdown()\n")
    out = _run(code, {"HOROVOD_CYCLE_TIME": "1.5", "HOROVOD_FUSION_THRESHOLD": str(3 << 20)})
    assert out.returncode == 0, out.stderr
    assert f"OUT 1.5 {3 << 20} False False" in out.stdout, out.stdout + out.stderr


def test_elastic_default_gives_way_to_environment_and_config(monkeypatch):
    monkeypatch.delenv("TFRING_TIMEOUT", raising=False)
    try:
        _tunables.configure({})
        _tunables.set_default("TFRING_TIMEOUT", _tunables.ELASTIC_WORKER_DEFAULTS["TFRING_TIMEOUT"])
        assert _tunables.get("TFRING_TIMEOUT") == 30.0
        assert _tunables.core_config() == {"TFRING_TIMEOUT": "30"}
        _tunables.configure({"TFRING_TIMEOUT": "44"})  # e.g. HOROVOD_GLOO_TIMEOUT_SECONDS
        _tunables.set_default("TFRING_TIMEOUT", "30")
        assert _tunables.get("TFRING_TIMEOUT") == 44.0
        _tunables.configure({})
        monkeypatch.setenv("TFRING_TIMEOUT", "45")
        _tunables.set_default("TFRING_TIMEOUT", "30")
        assert _tunables.get("TFRING_TIMEOUT") == 45.0 and _tunables.core_config() == {}
    finally:
        _tunables.configure({})
