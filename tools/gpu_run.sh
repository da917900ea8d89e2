#!/usr/bin/env bash
# The one command for a GPU machine: gets a CUDA build of tfring (the one
# carried in build-gpu/carry/pkg if it imports with this Python, else builds
# one), runs the GPU tests, then the GPU benchmark twice: with the ranks
# that share the GPU time-sliced (each its own GPU context, the default), and
# under the CUDA Multi-Process Service (MPS: one server context for all).
#
#   bash tools/gpu_run.sh [pytest args...]
#
# Steps, each reported and none stopping the others (only a missing build
# skips what needs it); a summary at the end:
#   build       the CUDA build (or the carried one)
#   gate-probe  tools/gpu_gate_probe.cu (the carried binary, else built with
#               nvcc): whether a stream gate (TFRING_GPU_COMPLETION=stream)
#               opens, and whether a closed one holds back the engine's
#               stream, with CUDA_DEVICE_MAX_CONNECTIONS unset and 32,
#               time-sliced and then under MPS; GATE_PROBE=0 skips it
#   mps-start   a private MPS control daemon: nvidia-cuda-mps-control -d with
#               CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY in a fresh
#               temporary directory (or the system's daemon in
#               /tmp/nvidia-mps when one runs, left running)
#   tests       tests/gpu/test_gpu.py, test_gpu_kernels.py and
#               test_gpu_collectives.py (or $GPU_TESTS), under MPS when it
#               started, else time-sliced
#   steps       training steps on the GPU, when STEP_BENCH is set: for each
#               ';'-separated argument list in it, benchmarks/entry_points.py
#               --gpu ARGS (its ranks share GPU 0), under MPS when it started
#   tf-op       the allreduce through the core and the TF op on GPU
#               tensors, when TF_OP_BENCH is set (its arguments to
#               benchmarks/tf_op_gpu_bench.py), under MPS when it started
#   bench-mps   benchmarks/gpu_bench.py --mode mps
#   mps-stop    echo quit | nvidia-cuda-mps-control (also on any exit)
#   bench-timeslice  benchmarks/gpu_bench.py --mode timeslice, MPS stopped
#               and the pipe directory pointed at an empty one
#
# Environment: PYTHON (default python3), BENCH_ARGS (passed to
# gpu_bench.py, e.g. "--quick"; BENCH_ARGS_MPS and BENCH_ARGS_TIMESLICE
# (default "--algos ring,auto,host") are added for one mode), OUT (if set: test_gpu.log,
# gpu_bench_mps.json, gpu_bench_timeslice.json and the MPS logs are written
# there), SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_MPS=1, GPU_TESTS (test files,
# default the three above), STEP_BENCH (';'-separated lists; leading
# NAME=value words in a list are that job's environment) and
# STEP_BENCH_TIMEOUT (seconds per list, default 900; step_bench.log and
# step_bench_N.json in OUT), TF_OP_BENCH (tf_op_gpu_bench.py's arguments;
# tf_op_gpu.log and tf_op_gpu.json in OUT), GATE_PROBE (0: no gate probe;
# gate_probe.log in OUT). TFRING_TF_PYTHONPATH (where TensorFlow is
# importable from; tools/gpu_tf_stage.sh run sets it): the carried build
# when it has an op library that loads into that TensorFlow
# (tools/gpu_tf_build.sh), else build the TensorFlow op library too
# (build-gpu-tf-run/), its GPU kernels registered as TFRING_TF_GPU says
# (cmake/tensorflow.cmake; default AUTO).
# Building needs cmake, ninja (or make) and pybind11: from PATH and Python,
# or from build-gpu/carry/deps (tools/gpu_carry.sh prepares it on a
# machine that has them). Exit status: 0 when every step that ran passed,
# 1 otherwise, 2 when there is no usable build.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
CARRY=$ROOT/build-gpu/carry
BUILD=$ROOT/build-gpu-run
TF_PATH=${TFRING_TF_PYTHONPATH:-}
[[ -n "$TF_PATH" ]] && BUILD=$ROOT/build-gpu-tf-run
PKG=$BUILD/pkg
OUTDIR=${OUT:-}
[[ -n "$OUTDIR" ]] && mkdir -p "$OUTDIR"
log() { printf 'gpu_run: %s\n' "$*" >&2; }
# Passes standard input through, and to $OUT/NAME too when OUT is set
# (out_log [-a] NAME; -a appends).
out_log() {
  local append=()
  if [[ $1 == -a ]]; then append=(-a); shift; fi
  if [[ -n "$OUTDIR" ]]; then tee ${append[@]+"${append[@]}"} "$OUTDIR/$1"; else cat; fi
}

# ------------------------------------------------------------ steps ----
STEPS=()
RESULTS=()
note() { STEPS+=("$1"); RESULTS+=("$2"); log "$1: $2"; }
# step NAME CMD...: runs CMD, records ok / FAILED (exit status).
step() {
  local name=$1 rc
  shift
  log "---- $name"
  "$@"
  rc=$?
  if [[ $rc -eq 0 ]]; then note "$name" ok; else note "$name" "FAILED (exit $rc)"; fi
  return $rc
}
summary() {
  local i bad=0
  printf '\ngpu_run summary:\n' >&2
  for i in "${!STEPS[@]}"; do
    printf '  %-18s %s\n' "${STEPS[$i]}" "${RESULTS[$i]}" >&2
    [[ "${RESULTS[$i]}" == FAILED* ]] && bad=1
  done
  if [[ -n "$OUTDIR" ]]; then
    for i in "${!STEPS[@]}"; do printf '%s\t%s\n' "${STEPS[$i]}" "${RESULTS[$i]}"; done \
      > "$OUTDIR/summary.tsv"
  fi
  return $bad
}

# ------------------------------------------------------------ build ----
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
  if [[ -n "$TF_PATH" && ! -f "$PKG/tfring/_tfring_ops.so" ]]; then return 1; fi
  (cd /tmp && PYTHONPATH="$PKG" "$PY" -c "from tfring import _core; assert _core.cuda_built()") \
    >/dev/null 2>&1 || return 1
  [[ -z "$TF_PATH" ]] && return 0
  # The op library must load into this TensorFlow (a carried one was built
  # against the same version elsewhere).
  (cd /tmp && PYTHONPATH="$TF_PATH" TF_CPP_MIN_LOG_LEVEL=2 "$PY" -c "
import tensorflow as tf
tf.load_op_library('$PKG/tfring/_tfring_ops.so')") >/dev/null 2>&1
}

build() {
  mkdir -p "$PKG/tfring"
  # The carried build, when it has what this run needs (the op library
  # too when TensorFlow is on the path: tools/gpu_tf_build.sh).
  if compgen -G "$CARRY/pkg/tfring/_core*.so" >/dev/null &&
     [[ -z "$TF_PATH" || -f "$CARRY/pkg/tfring/_tfring_ops.so" ]]; then
    cp "$CARRY"/pkg/tfring/*.so* "$PKG/tfring/"
  fi
  link_sources
  if imports; then
    log "using the prebuilt CUDA build ($(cat "$CARRY/pkg/PYTHON_VERSION" 2>/dev/null))"
    return 0
  fi
  log "building tfring with CUDA into $BUILD"
  rm -f "$PKG"/tfring/*.so
  [[ -d "$CARRY/deps" ]] && export PATH="$CARRY/deps/cmake/bin:$CARRY/deps/bin:$PATH"
  local cmake pybind gen=()
  cmake=$(command -v cmake || true)
  [[ -n "$cmake" ]] || { log "error: no cmake (and no build-gpu/carry/deps)"; return 2; }
  pybind=${pybind11_DIR:-}
  [[ -z "$pybind" && -d "$CARRY/deps/pybind11" ]] && pybind=$CARRY/deps/pybind11/share/cmake/pybind11
  [[ -z "$pybind" ]] && pybind=$("$PY" -c "import pybind11; print(pybind11.get_cmake_dir())" 2>/dev/null)
  [[ -n "$pybind" ]] || { log "error: no pybind11 (pip install pybind11, or set pybind11_DIR)"; return 2; }
  command -v ninja >/dev/null && gen=(-G Ninja)
  local tf=(-DTFRING_WITH_TF=OFF)
  [[ -n "$TF_PATH" ]] && tf=(-DTFRING_WITH_TF=ON -DTFRING_TF_PYTHONPATH="$TF_PATH"
                             -DTFRING_TF_GPU="${TFRING_TF_GPU:-AUTO}")
  "$cmake" -S "$ROOT" -B "$BUILD" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release \
    -DTFRING_WITH_CUDA=ON "${tf[@]}" -DTFRING_OUTPUT_DIR="$PKG/tfring" \
    -Dpybind11_DIR="$pybind" -DPython_EXECUTABLE="$(command -v "$PY")" || return 2
  "$cmake" --build "$BUILD" -j "$(nproc)" || return 2
  link_sources
  imports || { log "error: the build does not import"; return 2; }
}

if ! step build build; then
  summary
  exit 2
fi
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
(cd /tmp && "$PY" -c "
from tfring import _core
print('cuda_available:', _core.cuda_available(), _core.cuda_unavailable_reason())
print('devices:', [_core.cuda_describe(i) for i in range(_core.cuda_device_count())])
print('nccl:', _core.nccl_info())")

# -------------------------------------------------------------- MPS ----
# The CUDA driver uses MPS when it finds the control daemon's pipe in
# $CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) at initialization. Our
# daemon gets private directories, so nothing else on the machine is
# affected, and is stopped on every exit path (trap).
MPS_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tfring-mps.XXXXXX")
NO_MPS=$MPS_TMP/none        # an empty pipe directory: MPS off for sure
MPS_PIPE=""                 # the pipe directory while MPS runs
MPS_OURS=0
MPS_WHY=""

mps_start() {
  if [[ "${SKIP_MPS:-0}" == 1 ]]; then MPS_WHY="SKIP_MPS=1"; return 1; fi
  if [[ -p /tmp/nvidia-mps/control || -S /tmp/nvidia-mps/control ]]; then
    MPS_PIPE=/tmp/nvidia-mps
    log "an MPS control daemon already runs (/tmp/nvidia-mps): using it, leaving it running"
    return 0
  fi
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    MPS_WHY="nvidia-cuda-mps-control is not on PATH"
    return 1
  fi
  mkdir -p "$MPS_TMP/pipe" "$MPS_TMP/log"
  if ! CUDA_MPS_PIPE_DIRECTORY=$MPS_TMP/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_TMP/log \
       nvidia-cuda-mps-control -d; then
    MPS_WHY="nvidia-cuda-mps-control -d failed"
    return 1
  fi
  MPS_OURS=1
  local i
  for ((i = 0; i < 100; i++)); do
    if [[ -p $MPS_TMP/pipe/control || -S $MPS_TMP/pipe/control ]]; then
      MPS_PIPE=$MPS_TMP/pipe
      log "MPS control daemon started (CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE)"
      return 0
    fi
    sleep 0.1
  done
  MPS_WHY="the MPS control daemon did not create $MPS_TMP/pipe/control within 10 s"
  return 1
}

mps_stop() {
  [[ $MPS_OURS == 1 ]] || return 0
  MPS_OURS=0
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_TMP/pipe timeout 60 nvidia-cuda-mps-control || return 1
  # The daemon leaves its control pipe behind when it exits (seen with
  # driver 580): wait for the process itself, then remove the directory so
  # that nothing can attach to a stale pipe.
  local i gone=0
  for ((i = 0; i < 100; i++)); do
    if ! pgrep -f nvidia-cuda-mps-control >/dev/null && ! pgrep -f nvidia-cuda-mps-server >/dev/null; then
      gone=1
      break
    fi
    sleep 0.1
  done
  rm -rf "$MPS_TMP/pipe"
  MPS_PIPE=""
  if [[ -n "$OUTDIR" && -d "$MPS_TMP/log" ]]; then
    mkdir -p "$OUTDIR/mps-log" && cp -r "$MPS_TMP/log/." "$OUTDIR/mps-log/" 2>/dev/null
  fi
  [[ $gone == 1 ]] || { log "the MPS control daemon did not quit within 10 s"; return 1; }
}

cleanup() {
  mps_stop >/dev/null 2>&1
  rm -rf "$MPS_TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs "$@" with the GPU shared the given way: mps (our daemon's pipe
# directory) or timeslice (an empty pipe directory).
with_mode() {
  local mode=$1
  shift
  if [[ $mode == mps ]]; then
    env CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" TFRING_BENCH_MODE=mps "$@"
  else
    env CUDA_MPS_PIPE_DIRECTORY="$NO_MPS" TFRING_BENCH_MODE=timeslice "$@"
  fi
}

run_tests() {
  local mode=$1 t files=()
  local tests="tests/gpu/test_gpu.py tests/gpu/test_gpu_kernels.py"
  tests+=" tests/gpu/test_gpu_collectives.py"
  tests=${GPU_TESTS:-$tests}
  shift
  for t in $tests; do files+=("$ROOT/$t"); done
  log "GPU tests ($mode): $tests"
  (cd /tmp && with_mode "$mode" "$PY" -m pytest -q -rfEs "${files[@]}" "$@") 2>&1 \
    | out_log test_gpu.log
}

# Time-sliced, the peer algorithms (one-shot/two-shot) spin in a kernel
# until the other context's time slice: milliseconds per call, and auto
# never picks them there. They are measured under MPS only, unless
# BENCH_ARGS_TIMESLICE says otherwise.
BENCH_ARGS_TIMESLICE=${BENCH_ARGS_TIMESLICE---algos ring,auto,host}
run_bench() {
  local mode=$1 json=() extra
  [[ -n "$OUTDIR" ]] && json=(--json "$OUTDIR/gpu_bench_$mode.json")
  if [[ $mode == timeslice ]]; then extra=$BENCH_ARGS_TIMESLICE; else extra=${BENCH_ARGS_MPS:-}; fi
  # shellcheck disable=SC2086  # BENCH_ARGS and extra are lists of words
  (cd /tmp && with_mode "$mode" "$PY" "$ROOT/benchmarks/gpu_bench.py" --mode "$mode" \
    ${BENCH_ARGS:-} $extra ${json[@]+"${json[@]}"})
}

# Training steps through every entry point on the GPU (needs the op
# library: TFRING_TF_PYTHONPATH). One entry_points.py job per list.
run_steps() {
  local mode=$1 args i=0 rc=0 lists json
  IFS=';' read -ra lists <<< "$STEP_BENCH"
  for args in "${lists[@]}"; do
    [[ -n "${args// /}" ]] || continue
    i=$((i + 1))
    # Leading NAME=value words are the job's environment, e.g.
    # "TFRING_GPU_COMPLETION=stream --model resnet50 ...".
    local envs=() words
    read -ra words <<< "$args"
    while [[ ${#words[@]} -gt 0 && ${words[0]} =~ ^[A-Z_][A-Z0-9_]*= ]]; do
      envs+=("${words[0]}")
      words=("${words[@]:1}")
    done
    args="${words[*]}"
    json=()
    [[ -n "$OUTDIR" ]] && json=(--json "$OUTDIR/step_bench_$i.json")
    log "steps $i ($mode): ${envs[*]+${envs[*]} }entry_points.py --gpu $args"
    # The job's own deadline comes first (a later --timeout in args wins):
    # tfring-run then stops the ranks and entry_points.py prints their
    # output's tail (stall reports included) instead of being killed mute.
    # shellcheck disable=SC2086  # args is a list of words
    (cd /tmp && with_mode "$mode" env ${envs[@]+"${envs[@]}"} timeout "${STEP_BENCH_TIMEOUT:-900}" "$PY" \
      "$ROOT/benchmarks/entry_points.py" --gpu --timeout "$((${STEP_BENCH_TIMEOUT:-900} - 30))" \
      $args ${json[@]+"${json[@]}"}) 2>&1 \
      | out_log -a step_bench.log
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  done
  return $rc
}

# The same allreduce through the core and the TF op on GPU tensors (needs
# the op library).
run_tf_op() {
  local mode=$1 json=()
  [[ -n "$OUTDIR" ]] && json=(--json "$OUTDIR/tf_op_gpu.json")
  # shellcheck disable=SC2086  # TF_OP_BENCH is a list of words
  (cd /tmp && with_mode "$mode" timeout "${TF_OP_BENCH_TIMEOUT:-300}" "$PY" \
    "$ROOT/benchmarks/tf_op_gpu_bench.py" $TF_OP_BENCH ${json[@]+"${json[@]}"}) 2>&1 \
    | out_log tf_op_gpu.log
  return "${PIPESTATUS[0]}"
}

# ------------------------------------------------------- gate probe ----
GATE_BIN=""
gate_probe_build() {
  if [[ -x "$CARRY/gpu_gate_probe" ]]; then
    GATE_BIN=$CARRY/gpu_gate_probe
    return 0
  fi
  command -v nvcc >/dev/null || { log "no nvcc and no carried gpu_gate_probe"; return 1; }
  nvcc -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75 \
    -o "$MPS_TMP/gpu_gate_probe" "$ROOT/tools/gpu_gate_probe.cu" || return 1
  GATE_BIN=$MPS_TMP/gpu_gate_probe
}

# One run per setting of the hardware queues; each held case costs 200 ms.
run_gate_probe() {
  local mode=$1 rc=0 c
  for c in "" 32; do
    (cd /tmp && with_mode "$mode" env -u CUDA_DEVICE_MAX_CONNECTIONS \
      ${c:+CUDA_DEVICE_MAX_CONNECTIONS=$c} timeout 120 "$GATE_BIN" --streams 16 \
      --timeout-ms 200) 2>&1 | sed "s/^/[$mode] /" | out_log -a gate_probe.log
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  done
  return $rc
}

GATE=0
if [[ "${GATE_PROBE:-1}" != 0 ]] && step gate-build gate_probe_build; then
  GATE=1
  step gate-probe-timeslice run_gate_probe timeslice
fi

MODE=timeslice
if step mps-start mps_start; then
  MODE=mps
else
  [[ -n "$MPS_WHY" ]] && log "MPS not used: $MPS_WHY"
  RESULTS[${#RESULTS[@]} - 1]="not started (${MPS_WHY:-see above}); tests run time-sliced"
fi

if [[ $GATE == 1 && $MODE == mps ]]; then
  step gate-probe-mps run_gate_probe mps
fi

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  step "tests ($MODE)" run_tests "$MODE" "$@"
else
  note tests "skipped (SKIP_TESTS=1)"
fi

if [[ -n "${STEP_BENCH:-}" ]]; then
  step "steps ($MODE)" run_steps "$MODE"
fi

if [[ -n "${TF_OP_BENCH:-}" ]]; then
  step "tf-op ($MODE)" run_tf_op "$MODE"
fi

if [[ "${SKIP_BENCH:-0}" == 1 ]]; then
  note bench "skipped (SKIP_BENCH=1)"
elif [[ $MODE == mps ]]; then
  step bench-mps run_bench mps
else
  note bench-mps "skipped (MPS not started)"
fi

if [[ $MPS_OURS == 1 ]]; then
  step mps-stop mps_stop
fi

if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  step bench-timeslice run_bench timeslice
fi

summary
