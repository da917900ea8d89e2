#!/usr/bin/env bash
# tfring developer entry point.
#
#   ./dev.sh setup          create .venv and build/install tfring into it
#   ./dev.sh test [ARGS]    setup, then python -m pytest -q tests/ ARGS; without
#                           ARGS also the GPU tests on the CUDA emulation build
#   ./dev.sh demo           setup, then tfring-run -np 2 python examples/keras_digits.py
#
# Setup is incremental: the first run creates .venv (python3.11, else
# python3), installs the build tools and `pip install -e ".[test]"`; later
# runs only rebuild the native code with CMake (build dir: $TFRING_BUILD_DIR,
# default build/) unless setup.py or pyproject.toml changed.
#
# Environment: TFRING_VENV (default .venv), TFRING_BUILD_DIR (default build),
# TFRING_BUILD_TYPE (Release), TFRING_BUILD_JOBS, TFRING_WITH_TF / _CUDA,
# TFRING_TF_GPU (AUTO|ON|OFF), TFRING_UNITY_BUILD (1: a unity build; the
# default under CI=true), PYTHON (the interpreter that creates the venv).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$PWD
VENV=${TFRING_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
STAMP=$VENV/.tfring-install-stamp
export TFRING_BUILD_DIR=${TFRING_BUILD_DIR:-$ROOT/build}
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf 'dev.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

pip_quiet=()
if [[ "${CI:-}" == "true" || ! -t 1 ]]; then pip_quiet=(-q); fi

base_python() {
  local cand
  for cand in "${PYTHON:-}" python3.11 python3; do
    [[ -n "$cand" ]] || continue
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  die "no python3.10+ found (tried \$PYTHON, python3.11, python3)"
}

ensure_venv() {
  if [[ -x "$PY" ]] && "$PY" -c 'import sys' >/dev/null 2>&1; then
    return 0
  fi
  local base
  base=$(base_python)
  log "creating $VENV with $base ($("$base" --version 2>&1))"
  rm -rf "$VENV"
  "$base" -m venv "$VENV"
}

# True when something that needs a full `pip install -e` changed since the
# last one (or there was none).
needs_install() {
  [[ -f "$STAMP" ]] || return 0
  [[ -f "$TFRING_BUILD_DIR/CMakeCache.txt" ]] || return 0
  compgen -G "$ROOT/tfring/_core*.so" >/dev/null || return 0
  local f
  for f in setup.py pyproject.toml requirements/test.txt; do
    [[ -f "$f" && "$f" -nt "$STAMP" ]] && return 0
  done
  return 1
}

jobs() { echo "${TFRING_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"; }

# pip's editable build links into a temporary directory and copies back only
# the extension module, not libtfring_core.so beside it (nor the TF op
# library). Point the CMake build at the source tree's tfring/ instead, so
# every library lands next to tfring/_core*.so and a rebuild updates them in
# place. Re-pointing an existing build dir only relinks.
build_in_tree() {
  local out=$ROOT/tfring
  if ! grep -qx "TFRING_OUTPUT_DIR:PATH=$out" "$TFRING_BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
    PATH="$VENV/bin:$PATH" "$VENV/bin/cmake" -S "$ROOT" -B "$TFRING_BUILD_DIR" \
      -DTFRING_OUTPUT_DIR="$out" >/dev/null \
      || die "cmake configure failed: cmake -S . -B $TFRING_BUILD_DIR"
  fi
  # Already installed: CMake rebuilds whatever changed in csrc/ (and
  # re-configures itself when CMakeLists.txt or the source lists change).
  PATH="$VENV/bin:$PATH" "$VENV/bin/cmake" --build "$TFRING_BUILD_DIR" -j "$(jobs)" >/dev/null \
    || die "build failed: see cmake --build $TFRING_BUILD_DIR"
}

setup() {
  ensure_venv
  # CI builds once from scratch: a unity build (setup.py) takes less CPU
  # time there; an incremental developer build recompiles less without it.
  [[ "${CI:-}" == "true" ]] && export TFRING_UNITY_BUILD=${TFRING_UNITY_BUILD:-1}
  if needs_install; then
    log "installing build tools and tfring[test] into $VENV"
    "$PY" -m pip install "${pip_quiet[@]}" --upgrade pip
    "$PY" -m pip install "${pip_quiet[@]}" --upgrade setuptools wheel pybind11 cmake ninja numpy
    # Test dependencies first: TensorFlow must be importable when CMake
    # configures, so the op library gets built against it.
    "$PY" -m pip install "${pip_quiet[@]}" -r requirements/test.txt
    # The build tools come from the venv (no isolated build env), so CMake's
    # build dir stays valid between runs.
    PATH="$VENV/bin:$PATH" "$PY" -m pip install "${pip_quiet[@]}" \
      --no-build-isolation -e ".[test]"
    build_in_tree
    touch "$STAMP"
  else
    build_in_tree
  fi
}

activate() {
  export VIRTUAL_ENV=$VENV
  export PATH="$VENV/bin:$PATH"
}

# tests/run/test_spark.py needs Java 17+ for pyspark: Debian's headless runtime
# where `java` is missing and apt-get can install it (as root); otherwise
# the Spark tests skip and say why.
ensure_java() {
  command -v java >/dev/null 2>&1 && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing openjdk-17-jre-headless for the Spark tests"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        openjdk-17-jre-headless; } >/dev/null 2>&1 || log "could not install Java: Spark tests skip"
  fi
  return 0
}

# A safety net against hanging tests, unless the project's pytest config or
# the caller sets a timeout of its own.
default_test_timeout() {
  [[ -n "${PYTEST_TIMEOUT:-}" ]] && return 0
  if grep -qsE '^\s*timeout\s*=' pytest.ini tox.ini setup.cfg pyproject.toml; then
    return 0
  fi
  "$PY" -c 'import pytest_timeout' >/dev/null 2>&1 && export PYTEST_TIMEOUT=600
  return 0
}

cmd=${1:-help}
[[ $# -gt 0 ]] && shift
case "$cmd" in
  setup)
    setup
    log "ready: source $VENV/bin/activate"
    ;;
  test)
    setup
    ensure_java
    activate
    default_test_timeout
    rc=0
    # The GPU tests run once more afterwards, on the CUDA emulation build (no
    # GPU needed): the product's GPU kernels, rings and stream ordering on
    # host threads. That build compiles meanwhile, at the lowest priority, so
    # it takes the cores only while the suite waits (deadlines, sleeps), and
    # in a directory of its own: the main suite looks for build-emu and must
    # not find one half built.
    emu=0
    [[ $# -eq 0 && "${TFRING_SKIP_GPU_EMU:-0}" != 1 ]] && emu=1
    emu_build=${TFRING_EMU_BUILD:-$ROOT/build-emu-test}
    # The static-runtime variant tests/core/test_symbols.py links against the
    # system libstdc++, and the parsers' AddressSanitizer fuzzer
    # (test_security.py), build the same way first (their tests wait on the
    # build's lock, then find nothing left to do).
    bg=0
    [[ $# -eq 0 ]] && bg=1
    emu_pid=
    if [[ $bg -eq 1 ]]; then
      mkdir -p "$emu_build"
      (
        nice -n 19 "$PY" tests/static_runtime.py || true
        TFRING_FUZZ_BUILD="$TFRING_BUILD_DIR/fuzz-asan" TFRING_FUZZ_BUILD_ONLY=1 \
          nice -n 19 bash tests/fuzz/run_asan.sh || true
        if [[ $emu -eq 1 && -z "${TFRING_EMU_BUILD:-}" ]]; then
          PYTHON="$PY" TFRING_EMU_BUILD="$emu_build" TFRING_EMU_BUILD_ONLY=1 \
            nice -n 19 bash tests/gpu_emu.sh
        fi
      ) >"$emu_build/background.log" 2>&1 &
      emu_pid=$!
      trap '{ pkill -P "$emu_pid" || true; kill "$emu_pid" || true; } 2>/dev/null' EXIT
    fi
    "$PY" -m pytest -q --durations=15 tests/ "$@" || rc=$?
    if [[ $rc -eq 5 ]]; then
      log "pytest collected no tests"
      rc=0
    fi
    # A failed early build is retried in the foreground, which shows why.
    if [[ -n "$emu_pid" ]] && ! wait "$emu_pid"; then
      log "a build in the background failed: see $emu_build/background.log"
    fi
    if [[ $emu -eq 1 ]]; then
      log "GPU tests on the CUDA emulation build (tests/gpu_emu.sh)"
      emu_rc=0
      PYTHON="$PY" TFRING_EMU_BUILD="$emu_build" bash tests/gpu_emu.sh || emu_rc=$?
      [[ $emu_rc -eq 5 ]] && emu_rc=0
      [[ $rc -eq 0 ]] && rc=$emu_rc
    fi
    exit $rc
    ;;
  demo)
    setup
    activate
    demo=examples/keras_digits.py
    [[ -f "$demo" ]] || die "$demo is missing"
    exec tfring-run -np 2 python "$demo" "$@"
    ;;
  help|-h|--help)
    sed -n '2,8s/^# \{0,1\}//p' "$0"
    ;;
  *)
    log "unknown command: $cmd"
    sed -n '2,8s/^# \{0,1\}//p' "$0" >&2
    exit 2
    ;;
esac
