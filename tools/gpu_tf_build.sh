#!/usr/bin/env bash
# The GPU machine's build of tfring, made on this machine: the CUDA kernels
# and the TensorFlow op library with its GPU kernels registered, for the GPU
# machine's Python and the TensorFlow that tools/gpu_tf_stage.sh carries
# there. Compiling the op library against TensorFlow's headers takes about
# 6 minutes of a lent GPU machine's 16 cores; carried ready-made, the call
# that completes the wheels goes straight to the tests.
#
#   bash tools/gpu_tf_build.sh
#
# Makes a virtual environment for that Python ($GPU_BUILD_VENV, default
# build-gpu-tf/venv) with $TF_REQ, pybind11, cmake and ninja from the
# package index, builds into build-gpu-tf/ (the machine's nvcc, the default
# architectures of cmake/cuda.cmake), then puts the libraries in
# build-gpu/carry/pkg (tools/gpu_carry.sh with NO_DEPS=1: the GPU machine
# has its own cmake, ninja and pybind11 for a fallback build). Carry
# build-gpu/carry in a device call; tools/gpu_run.sh uses it when its op
# library loads into the staged TensorFlow, and builds otherwise.
#
# Environment: GPU_PYTHON_VERSION (default 3.12: the GPU machine's),
# TF_REQ (default tensorflow==2.21.0, the version gpu_tf_stage.sh stages),
# GPU_BUILD_VENV. Binaries made here run there when this machine's glibc and
# libstdc++ are no newer than the GPU machine's (Debian 12 here, Ubuntu 24.04
# there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PYV=${GPU_PYTHON_VERSION:-3.12}
TF_REQ=${TF_REQ:-tensorflow==2.21.0}
VENV=${GPU_BUILD_VENV:-$ROOT/build-gpu-tf/venv}
BUILD=$ROOT/build-gpu-tf
log() { printf 'gpu_tf_build: %s\n' "$*" >&2; }

if [[ ! -x $VENV/bin/python ]]; then
  base=$(command -v "python$PYV" || true)
  if [[ -z $base ]]; then
    for cand in "$HOME"/.pyenv/versions/"$PYV".*/bin/python; do
      [[ -x $cand ]] && base=$cand
    done
  fi
  [[ -n $base ]] || { log "error: no python$PYV here (install it, or set GPU_PYTHON_VERSION)"; exit 2; }
  log "virtual environment for $("$base" --version) in $VENV"
  "$base" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q "$TF_REQ" pybind11 cmake ninja
PYBIND=$("$VENV/bin/python" -c "import pybind11; print(pybind11.get_cmake_dir())")
export PATH="$VENV/bin:$PATH"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTFRING_WITH_CUDA=ON -DTFRING_WITH_TF=ON -DTFRING_TF_GPU=ON \
  -DTFRING_OUTPUT_DIR="$BUILD/pkg/tfring" -Dpybind11_DIR="$PYBIND" \
  -DPython_EXECUTABLE="$VENV/bin/python"
cmake --build "$BUILD" -j "$(nproc)"
[[ -f $BUILD/pkg/tfring/_tfring_ops.so ]] || { log "error: no op library was built"; exit 1; }
PYTHON=$VENV/bin/python NO_DEPS=1 bash "$ROOT/tools/gpu_carry.sh" "$BUILD"
