#!/usr/bin/env bash
# Builds a binary wheel of tfring for the TensorFlow the build's Python has
# (TensorFlow 2.21 on CPython 3.11: tfring-0.1.0-cp311-cp311-linux_x86_64.whl).
#
#   tools/build_wheel.sh [OUT_DIR]          (default: dist/)
#
# The wheel holds the Python package, tfring/_core, libtfring_core.so and the
# TensorFlow op library _tfring_ops.so (with the files recording its
# TensorFlow version, XLA and GPU state). The op library links to
# libtensorflow_framework.so.2 and libtensorflow_cc.so.2 without bundling
# them: its run path is $ORIGIN/../tensorflow (the tensorflow package beside
# tfring in site-packages), and TensorFlow has loaded both by soname before
# tf.load_op_library runs, so one installed elsewhere on sys.path serves too.
# The wheel requires exactly the TensorFlow it was built against.
#
# Environment:
#   PYTHON             the interpreter whose TensorFlow, pybind11, cmake and
#                      ninja build it (default: python3 on PATH)
#   TFRING_BUILD_DIR   CMake's build dir (default: build/wheel-<python tag>);
#                      kept between runs, so a rebuild compiles only what
#                      changed and otherwise only repackages
#   TFRING_BUILD_JOBS  parallel compile jobs (default: the CPU count)
#   TFRING_TF_GPU, TFRING_WITH_CUDA, TFRING_TF_XLA: as for any build (README)
#
# No manylinux tag: the libraries need this machine's glibc and libstdc++,
# which auditwheel would have to check (and tensorflow's own libraries are
# not to be grafted into the wheel); the platform tag stays linux_x86_64.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
OUT=${1:-$ROOT/dist}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
export TFRING_BUILD_DIR=${TFRING_BUILD_DIR:-$ROOT/build/wheel-$tag}
# A wheel without the op library is not what this script is for.
export TFRING_WITH_TF=ON

missing=$("$PY" - <<'EOF'
import importlib.util
need = ["tensorflow", "pybind11", "cmake", "ninja", "setuptools", "wheel"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
if [[ -n "$missing" ]]; then
  echo "build_wheel.sh: $PY lacks: $missing (pip install $missing)" >&2
  exit 1
fi
# The build tools of $PY's environment (cmake, ninja) come first.
export PATH="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')"):$PATH"

# Wheels of this build replace older ones of the same name.
rm -f "$OUT"/tfring-*-"$tag"-"$tag"-*.whl
# --no-build-isolation: build against the TensorFlow installed here (the one
# the wheel will require), with a build dir that survives between runs.
"$PY" -m pip wheel "$ROOT" --no-deps --no-build-isolation --disable-pip-version-check \
  -q -w "$OUT" >&2
ls "$OUT"/tfring-*-"$tag"-"$tag"-*.whl
