#!/usr/bin/env bash
# Prepares build-gpu/carry/ for a GPU machine that has no build tools or
# network: the CUDA build of tfring made here (pkg/tfring/*.so, usable when
# the GPU machine's Python is the same version; with the TensorFlow op
# library when the build has one, usable with the same TensorFlow) and, to
# build there otherwise, cmake, ninja and pybind11 from this machine's
# environment (deps/, about 50 MiB; NO_DEPS=1 leaves them out, for a
# machine that has its own). Then, on the GPU machine:
#
#   bash tools/gpu_run.sh          (with build-gpu/carry carried along)
#
# Usage: bash tools/gpu_carry.sh [BUILD_DIR]   (default build-gpu, which
# must hold a CUDA build whose TFRING_OUTPUT_DIR is BUILD_DIR/pkg/tfring).
# tools/gpu_tf_build.sh makes one with the op library for the GPU
# machine's Python and TensorFlow (docs/gpu-tensorflow.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build-gpu}
PY=${PYTHON:-python3}
CARRY=build-gpu/carry
rm -rf "$CARRY"
mkdir -p "$CARRY/pkg/tfring" "$CARRY/deps/bin"
cp "$BUILD"/pkg/tfring/*.so* "$CARRY/pkg/tfring/"
"$PY" --version > "$CARRY/pkg/PYTHON_VERSION" 2>&1
# The stream-gate probe (tools/gpu_run.sh's gate-probe step), so the GPU
# machine need not compile it.
if command -v nvcc >/dev/null; then
  nvcc -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75 \
    -o "$CARRY/gpu_gate_probe" tools/gpu_gate_probe.cu
fi
if [[ "${NO_DEPS:-0}" == 1 ]]; then
  du -sh "$CARRY"
  exit 0
fi

# cmake: the real binary (pip's `cmake` on PATH is a Python wrapper) and its
# modules, keeping bin/ and share/ side by side as cmake expects.
is_elf() { [[ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" == "177ELF" ]]; }
CMAKE_DATA=$("$PY" -c "import cmake; print(cmake.CMAKE_DATA)" 2>/dev/null || true)
if [[ -n "$CMAKE_DATA" ]]; then
  CMAKE_BIN=$CMAKE_DATA/bin/cmake
  CMAKE_SHARES=("$CMAKE_DATA"/share/cmake-*)
else
  CMAKE_BIN=$(readlink -f "$(command -v cmake)")
  CMAKE_SHARES=("$(dirname "$CMAKE_BIN")"/../share/cmake-*)
fi
CMAKE_SHARE=${CMAKE_SHARES[0]}
is_elf "$CMAKE_BIN" || { echo "gpu_carry: $CMAKE_BIN is not a cmake binary" >&2; exit 1; }
mkdir -p "$CARRY/deps/cmake/bin" "$CARRY/deps/cmake/share"
cp "$CMAKE_BIN" "$CARRY/deps/cmake/bin/cmake"
cp -r "$CMAKE_SHARE" "$CARRY/deps/cmake/share/"
NINJA=$(readlink -f "$(command -v ninja)")
is_elf "$NINJA" || NINJA=$("$PY" -c "import ninja, os; print(os.path.join(ninja.BIN_DIR, 'ninja'))")
is_elf "$NINJA" || { echo "gpu_carry: no ninja binary" >&2; exit 1; }
cp "$NINJA" "$CARRY/deps/bin/ninja"
PYBIND_PKG=$("$PY" -c "import os, pybind11; print(os.path.dirname(pybind11.__file__))")
cp -r "$PYBIND_PKG" "$CARRY/deps/pybind11"
rm -rf "$CARRY/deps/pybind11/__pycache__"
du -sh "$CARRY"
