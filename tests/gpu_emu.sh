#!/usr/bin/env bash
# Runs the GPU tests (tests/gpu/test_gpu.py, test_gpu_kernels.py,
# test_gpu_collectives.py, test_gpu_sets.py, and the GPU benchmark's dry run)
# on a machine without a GPU, against the CUDA emulation build: the product's
# CUDA kernels and GPU runtime (CUDA-IPC ring, host-staged ring, executor,
# stream handling) compiled with the host compiler and linked to a fake CUDA
# runtime whose streams are host threads and whose device memory and IPC
# handles are shared-memory mappings (tests/cuda_emu/README.md), and the NCCL
# backend against a fake NCCL whose collectives run on those stream threads.
# It proves the GPU code paths' logic and synchronization, not their speed.
#
#   bash tests/gpu_emu.sh [pytest args...]
#
# Environment: PYTHON (default python3; needs cmake, pybind11, numpy and
# pytest), TFRING_EMU_BUILD (default build-emu), TFRING_EMU_BUILD_ONLY=1
# (build and exit: ./dev.sh test builds ahead while the main suite runs),
# TFRING_EMU_DEVICES (default
# 2 emulated GPUs), TFRING_EMU_DELAY_US (default 100: each queued GPU
# operation first sleeps up to that long, so missing stream synchronization
# shows up as wrong results), TFRING_NCCL_LIB (default: the emulation's fake
# NCCL).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUILD=${TFRING_EMU_BUILD:-$ROOT/build-emu}
PKG=$BUILD/pkg
log() { printf 'gpu_emu: %s\n' "$*" >&2; }

# Ninja when available, chosen once: a configured build keeps its generator.
GEN=()
[[ ! -f "$BUILD/CMakeCache.txt" ]] && command -v ninja >/dev/null && GEN=(-G Ninja)
PYBIND=$("$PY" -c "import pybind11; print(pybind11.get_cmake_dir())")
log "building the CUDA emulation build in $BUILD"
# -O1 and a unity build (16 sources a translation unit): the emulation
# proves logic, not speed, and builds in a third of the CPU time.
# (Build type None: CMakeLists.txt pins Release to -O3.)
cmake -S "$ROOT" -B "$BUILD" ${GEN[@]+"${GEN[@]}"} -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_C_FLAGS=-O1 -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 \
  -DTFRING_WITH_CUDA=EMU -DTFRING_WITH_TF=OFF -DTFRING_OUTPUT_DIR="$PKG/tfring" \
  -Dpybind11_DIR="$PYBIND" -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
[[ "${TFRING_EMU_BUILD_ONLY:-0}" == 1 ]] && exit 0

# The package: the emulation build's libraries plus links to the sources.
for f in "$ROOT"/tfring/*.py "$ROOT"/tfring/*/; do
  ln -sfn "${f%/}" "$PKG/tfring/$(basename "$f")"
done
export PYTHONPATH="$PKG"
export TFRING_EMU_DELAY_US=${TFRING_EMU_DELAY_US:-100}
# Two emulated GPUs: the tests that need a GPU per rank run too.
export TFRING_EMU_DEVICES=${TFRING_EMU_DEVICES:-2}
# The emulation's fake NCCL (tests/cuda_emu/nccl), so the NCCL backend runs
# too; it is found through TFRING_NCCL_LIB only. Left alone when set.
if [[ -z "${TFRING_NCCL_LIB+set}" ]]; then
  export TFRING_NCCL_LIB="$BUILD/nccl/libnccl.so.2"
fi
(cd /tmp && "$PY" -c "
from tfring import _core
assert _core.cuda_emulated() and _core.cuda_available(), _core.cuda_unavailable_reason()
print('gpu_emu:', _core.cuda_describe(0))")
cd /tmp
# Also the GPU benchmark's dry run on this build (every algorithm and
# table path): the main suite runs before build-emu exists and skips it.
exec "$PY" -m pytest -q -rs "$ROOT/tests/gpu/test_gpu.py" "$ROOT/tests/gpu/test_gpu_kernels.py" \
  "$ROOT/tests/gpu/test_gpu_collectives.py" "$ROOT/tests/gpu/test_gpu_sets.py" \
  "$ROOT/tests/core/test_bench_gpu.py" "$@"
