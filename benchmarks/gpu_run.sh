#!/usr/bin/env bash
# The one command for a GPU machine: builds tfring with CUDA (unless a build
# in $TFRING_GPU_PKG already imports), runs the GPU tests, then the GPU
# benchmark.
#
#   bash benchmarks/gpu_run.sh [pytest args...]
#
# Environment: PYTHON (default python3), TFRING_GPU_BUILD_DIR (default
# build-gpu), TFRING_GPU_PKG (default $TFRING_GPU_BUILD_DIR/pkg: a directory
# holding tfring/{libtfring_core.so,_core*.so}), BENCH_ARGS (passed to
# gpu_bench.py, e.g. "--quick"), OUT (if set, results go there: pytest log
# and gpu_bench.json). Building needs cmake (on PATH or `pip install cmake`),
# ninja or make, and pybind11 (importable, or pybind11_DIR).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUILD=${TFRING_GPU_BUILD_DIR:-$ROOT/build-gpu}
PKG=${TFRING_GPU_PKG:-$BUILD/pkg}
OUTDIR=${OUT:-}
log() { printf 'gpu_run: %s\n' "$*" >&2; }

nvidia-smi -L 2>/dev/null || log "nvidia-smi not available"
"$PY" --version

# The package: built libraries plus links to the Python sources.
link_sources() {
  mkdir -p "$PKG/tfring"
  for f in "$ROOT"/tfring/*.py "$ROOT"/tfring/*/; do
    n=$(basename "$f")
    [[ -e "$PKG/tfring/$n" ]] || ln -s "$f" "$PKG/tfring/$n"
  done
}

imports() {
  (cd /tmp && PYTHONPATH="$PKG" "$PY" -c "from tfring import _core; assert _core.cuda_built()") \
    >/dev/null 2>&1
}

link_sources
if ! imports; then
  log "building tfring with CUDA into $BUILD"
  CMAKE=$(command -v cmake || true)
  if [[ -z "$CMAKE" ]]; then
    "$PY" -m pip install -q cmake ninja pybind11 >/dev/null 2>&1 || true
    CMAKE=$(command -v cmake || true)
  fi
  [[ -n "$CMAKE" ]] || { log "error: no cmake (pip install cmake)"; exit 2; }
  PYBIND=${pybind11_DIR:-$("$PY" -c "import pybind11; print(pybind11.get_cmake_dir())" 2>/dev/null)}
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
log "GPU tests"
if [[ -n "$OUTDIR" ]]; then
  (cd /tmp && "$PY" -m pytest -q -rs "$ROOT/tests/test_gpu.py" "$@" 2>&1 | tee "$OUTDIR/test_gpu.log") || rc=1
else
  (cd /tmp && "$PY" -m pytest -q -rs "$ROOT/tests/test_gpu.py" "$@") || rc=1
fi

log "GPU benchmark"
JSON=()
[[ -n "$OUTDIR" ]] && JSON=(--json "$OUTDIR/gpu_bench.json")
(cd /tmp && "$PY" "$ROOT/benchmarks/gpu_bench.py" ${BENCH_ARGS:-} "${JSON[@]}") || rc=1
exit $rc
