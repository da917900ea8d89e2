"""Symbol hygiene of the native libraries.

Every library tfring builds exports only its API: libtfring_core.so the
tfring:: names its sibling libraries import, the Python module PyInit__core,
the TF op library nothing TF looks up by name. None may export a piece of the
C++ runtime (std::/__gnu_cxx:: instantiations, __cxa_*, _Unwind_*): a
process that loaded another copy of the runtime first (CuPy, PyTorch and
TensorFlow load the system libstdc++.so.6) would otherwise have the dynamic
linker bind some of our calls to its copy and some to ours, which crashes
when our copy is linked statically (a SIGSEGV in std::ostream inside
_core.init()).

test_static_runtime_* build that case: a core-only variant (-O0) linked with
-static-libstdc++ -static-libgcc, under <build>/static-runtime (built once,
then only brought up to date), and run a 2-rank job with it in processes
that loaded the system libstdc++.so.6 globally before importing tfring.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest

import static_runtime
from multiproc import check_ok, run_ranks

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG = os.path.join(ROOT, "tfring")

# Demangled names that belong to the C++ runtime, with the prefixes the
# compiler puts before a class's own symbols (typeinfo, vtable, ...).
_RUNTIME = re.compile(
    r"^(?:(?:typeinfo(?: name)?|vtable|VTT|construction vtable|guard variable|"
    r"TLS init function|TLS wrapper function|(?:non-)?virtual thunk to|"
    r"covariant return thunk to) (?:for )?)?"
    r"(?:std::|__gnu_cxx::|__cxxabiv1::|__cxa_|__gxx_|_Unwind_|__once_proxy)")


def exports(path):
    """The defined dynamic symbols of `path`, demangled."""
    nm = subprocess.run(["nm", "-D", "--defined-only", path],
                        capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in nm.splitlines() if len(line.split()) >= 3]
    demangled = subprocess.run(["c++filt"], input="\n".join(names),
                               capture_output=True, text=True, check=True).stdout
    return demangled.splitlines()


def runtime_exports(path):
    """The defined dynamic symbols of `path` that belong to the C++ runtime."""
    return sorted(d for d in exports(path) if _RUNTIME.match(d))


# What each library must still export: what its users look up or import.
_API = {
    "libtfring_core.so": ["tfring::runtime::init(", "tfring::runtime::enqueue("],
    "_core.": ["PyInit__core"],
    "libnccl.so": ["ncclGetVersion", "ncclCommInitRank", "ncclAllReduce"],
}


def assert_exports_api(libs):
    for lib in libs:
        names = exports(lib)
        for prefix, wanted in _API.items():
            if os.path.basename(lib).startswith(prefix):
                for w in wanted:
                    assert any(n.startswith(w) for n in names), f"{lib} does not export {w}"


def assert_no_runtime_exports(libs):
    assert libs, "no libraries to check"
    bad = {}
    for lib in libs:
        found = runtime_exports(lib)
        if found:
            bad[os.path.relpath(lib, ROOT)] = found
    assert not bad, "libraries export C++ runtime symbols:\n" + "\n".join(
        f"  {lib}: {len(syms)} symbols, e.g. " + "; ".join(s[:120] for s in syms[:5])
        for lib, syms in bad.items())


def _tools():
    if not (shutil.which("nm") and shutil.which("c++filt")):
        pytest.skip("nm and c++filt (binutils) are needed to read the exports")


def package_libs(pkg):
    return sorted(glob.glob(os.path.join(pkg, "*.so")))


def test_package_libraries_export_no_runtime_symbols():
    _tools()
    assert_no_runtime_exports(package_libs(PKG))
    assert_exports_api(package_libs(PKG))


def test_emulation_build_exports_no_runtime_symbols():
    """The CUDA emulation build (tests/gpu_emu.sh), when it has been built:
    its core and its fake NCCL."""
    _tools()
    emu = os.environ.get("TFRING_EMU_BUILD") or os.path.join(ROOT, "build-emu")
    libs = package_libs(os.path.join(emu, "pkg", "tfring"))
    libs += glob.glob(os.path.join(emu, "nccl", "libnccl.so*"))
    if not libs:
        pytest.skip(f"no CUDA emulation build in {emu} (bash tests/gpu_emu.sh builds it)")
    assert_no_runtime_exports(libs)
    assert_exports_api(libs)


@pytest.fixture(scope="module")
def static_runtime_pkg():
    """A package whose libraries are the static-runtime variant's and whose
    Python files are links to the sources (tests/static_runtime.py; built
    in the background by ./dev.sh test, else here)."""
    _tools()
    why = static_runtime.unavailable()
    if why:
        pytest.skip(why)
    try:
        return static_runtime.build()
    except RuntimeError as e:
        pytest.fail(str(e))


def test_static_runtime_variant_exports_no_runtime_symbols(static_runtime_pkg):
    assert_no_runtime_exports(package_libs(os.path.join(static_runtime_pkg, "tfring")))


def test_static_runtime_job_after_system_libstdcxx(static_runtime_pkg):
    """2 ranks, each loading the system libstdc++.so.6 with RTLD_GLOBAL before
    importing the static-runtime variant's tfring._core: init and an
    allreduce (tests/workers/symbols.py) work and match numpy."""
    results = run_ranks(2, "symbols.py", env={"PYTHONPATH": static_runtime_pkg}, timeout=120)
    for r in results:
        assert r.returncode == 0, (
            f"rank {r.rank} exited {r.returncode} (a negative code is the signal that "
            f"killed it: -11 is the SIGSEGV of two mixed C++ runtimes)\n"
            f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
    for r, out in enumerate(check_ok(results)):
        assert out["core"].startswith(static_runtime_pkg), (r, out["core"])
        assert out["ok"], f"rank {r}: allreduce differs from numpy by {out['max_error']}"
