"""Builds the static-runtime variant tests/core/test_symbols.py checks: the core
alone (-O0, no TF, no CUDA, a unity build), linked with -static-libstdc++ -static-libgcc,
under <build>/static-runtime, its package at <build>/static-runtime/pkg
(the libraries built there, the Python files linked to the sources).

    python tests/static_runtime.py     # build, or bring up to date

`./dev.sh test` runs that in the background, at the lowest priority, while
the suite runs; the test's fixture calls build() too, which waits for a
build in progress (a lock file) and then finds nothing left to do.
"""

import fcntl
import glob
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "tfring")
BUILD = os.environ.get("TFRING_BUILD_DIR") or os.path.join(ROOT, "build")
STATIC_BUILD = os.path.join(BUILD, "static-runtime")
STATIC_PKG = os.path.join(STATIC_BUILD, "pkg")


def compiler():
    for cxx in (os.environ.get("CXX"), "c++", "g++"):
        if cxx and shutil.which(cxx.split()[0]):
            return cxx.split()[0]
    return None


def unavailable():
    """Why the variant cannot be built here (None when it can)."""
    cxx = compiler()
    if cxx is None:
        return "no C++ compiler to build the static-runtime variant"
    # -print-file-name returns the bare name when an archive is missing.
    for archive in ("libstdc++.a", "libgcc_eh.a"):
        out = subprocess.run([cxx, f"-print-file-name={archive}"],
                             capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(out) or not os.path.exists(out):
            return f"{cxx} has no {archive} (install the compiler's static libstdc++)"
    if not shutil.which("cmake"):
        return "cmake is needed to build the static-runtime variant"
    return None


def build():
    """Builds or updates the variant; returns its package directory. Raises
    RuntimeError with the build's output when it fails."""
    os.makedirs(STATIC_BUILD, exist_ok=True)
    with open(os.path.join(STATIC_BUILD, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time
        _build_locked()
    return STATIC_PKG


def _run(cmd, what, timeout):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what} {STATIC_BUILD} failed:\n{r.stdout[-5000:]}{r.stderr[-3000:]}")


def _build_locked():
    import pybind11

    out = os.path.join(STATIC_PKG, "tfring")
    if not os.path.exists(os.path.join(STATIC_BUILD, "CMakeCache.txt")):
        static = "-static-libstdc++ -static-libgcc"
        # -O0: faster to build, and stricter (more of the C++ runtime's
        # templates are emitted out of line, so any leak shows); a unity
        # build (16 sources a translation unit) takes 40% of the CPU time.
        cmd = ["cmake", "-S", ROOT, "-B", STATIC_BUILD, "-DCMAKE_BUILD_TYPE=None",
               "-DCMAKE_CXX_FLAGS=-O0",
               f"-DCMAKE_CXX_COMPILER={compiler()}",
               "-DTFRING_WITH_CUDA=OFF", "-DTFRING_WITH_TF=OFF",
               f"-DCMAKE_SHARED_LINKER_FLAGS={static}",
               f"-DCMAKE_MODULE_LINKER_FLAGS={static}",
               f"-DTFRING_OUTPUT_DIR={out}",
               f"-DPython_EXECUTABLE={sys.executable}",
               f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
               "-DCMAKE_UNITY_BUILD=ON", "-DCMAKE_UNITY_BUILD_BATCH_SIZE=16"]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"]
        if shutil.which("ccache"):
            cmd += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        _run(cmd, "configuring", 600)
    jobs = os.environ.get("TFRING_BUILD_JOBS") or str(os.cpu_count() or 2)
    _run(["cmake", "--build", STATIC_BUILD, "-j", jobs], "building", 1800)
    for f in glob.glob(os.path.join(PKG, "*.py")) + [
            d for d in glob.glob(os.path.join(PKG, "*")) if os.path.isdir(d)]:
        name = os.path.join(out, os.path.basename(f))
        if os.path.basename(f) == "__pycache__" or os.path.lexists(name):
            continue
        os.symlink(f, name)


if __name__ == "__main__":
    why = unavailable()
    if why:
        print(f"static_runtime: not built: {why}")
        sys.exit(0)
    print(build())
