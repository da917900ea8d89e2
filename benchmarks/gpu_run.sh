#!/usr/bin/env bash
# The one command for a GPU machine: gets a CUDA build of tfring (the one
# carried in build-gpu/carry/pkg if it imports with this Python, else builds
# one), runs the GPU tests, then the GPU benchmark.
#
#   bash benchmarks/gpu_run.sh [pytest args...]
#
# Environment: PYTHON (default python3), BENCH_ARGS (passed to
# gpu_bench.py, e.g. "--quick"), OUT (if set, the test log and
# gpu_bench.json are written there), SKIP_TESTS=1 / SKIP_BENCH=1.
# Building needs cmake, ninja (or make) and pybind11: from PATH and Python,
# or from build-gpu/carry/deps (benchmarks/gpu_carry.sh prepares it on a
# machine that has them).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
CARRY=$ROOT/build-gpu/carry
BUILD=$ROOT/build-gpu-run
PKG=$BUILD/pkg
OUTDIR=${OUT:-}
log() { printf 'gpu_run: %s\n' "$*" >&2; }

nvidia-smi -L 2>/dev/null || log "nvidia-smi not available"
"$PY" --version

# The package: built libraries plus links to the Python sources.
link_sources() {
  mkdir -p "$PKG/tfring"
  for f in "$ROOT"/tfring/*.py "$ROOT"/tfring/*/; do
    ln -sfn "${f%/}" "$PKG/tfring/$(basename "$f")"
  done
}

imports() {
  (cd /tmp && PYTHONPATH="$PKG" "$PY" -c "from tfring import _core; assert _core.cuda_built()") \
    >/dev/null 2>&1
}

mkdir -p "$PKG/tfring"
if compgen -G "$CARRY/pkg/tfring/_core*.so" >/dev/null; then
  cp "$CARRY"/pkg/tfring/*.so "$PKG/tfring/"
fi
link_sources
if imports; then
  log "using the prebuilt CUDA build ($(cat "$CARRY/pkg/PYTHON_VERSION" 2>/dev/null))"
else
  log "building tfring with CUDA into $BUILD"
  rm -f "$PKG"/tfring/*.so
  [[ -d "$CARRY/deps" ]] && export PATH="$CARRY/deps/cmake/bin:$CARRY/deps/bin:$PATH"
  CMAKE=$(command -v cmake || true)
  [[ -n "$CMAKE" ]] || { log "error: no cmake (and no build-gpu/carry/deps)"; exit 2; }
  PYBIND=${pybind11_DIR:-}
  [[ -z "$PYBIND" && -d "$CARRY/deps/pybind11" ]] && PYBIND=$CARRY/deps/pybind11/share/cmake/pybind11
  [[ -z "$PYBIND" ]] && PYBIND=$("$PY" -c "import pybind11; print(pybind11.get_cmake_dir())" 2>/dev/null)
  [[ -n "$PYBIND" ]] || { log "error: no pybind11 (pip install pybind11, or set pybind11_DIR)"; exit 2; }
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  "$CMAKE" -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTFRING_WITH_CUDA=ON \
    -DTFRING_WITH_TF=OFF -DTFRING_OUTPUT_DIR="$PKG/tfring" -Dpybind11_DIR="$PYBIND" \
    -DPython_EXECUTABLE="$(command -v "$PY")" || exit 2
  "$CMAKE" --build "$BUILD" -j "$(nproc)" || exit 2
  link_sources
  imports || { log "error: the build does not import"; exit 2; }
fi

export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
(cd /tmp && "$PY" -c "
from tfring import _core
print('cuda_available:', _core.cuda_available(), _core.cuda_unavailable_reason())
print('devices:', [_core.cuda_describe(i) for i in range(_core.cuda_device_count())])
print('nccl:', _core.nccl_info())")

rc=0
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  log "GPU tests"
  if [[ -n "$OUTDIR" ]]; then
    (cd /tmp && "$PY" -m pytest -q -rs "$ROOT/tests/test_gpu.py" "$@" 2>&1 | tee "$OUTDIR/test_gpu.log") || rc=1
  else
    (cd /tmp && "$PY" -m pytest -q -rs "$ROOT/tests/test_gpu.py" "$@") || rc=1
  fi
fi

if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  log "GPU benchmark"
  JSON=()
  [[ -n "$OUTDIR" ]] && JSON=(--json "$OUTDIR/gpu_bench.json")
  (cd /tmp && "$PY" "$ROOT/benchmarks/gpu_bench.py" ${BENCH_ARGS:-} "${JSON[@]}") || rc=1
fi
exit $rc
