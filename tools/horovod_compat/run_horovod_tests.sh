#!/usr/bin/env bash
# Runs Horovod's own test/parallel/test_tensorflow.py, unchanged, against
# tfring on 2 ranks under mpirun: the shim in tools/horovod_compat/shim makes
# `import horovod.tensorflow as hvd` bind tfring itself.
#
#   tools/horovod_compat/run_horovod_tests.sh [pytest args...]
#
# Horovod's sources are not part of this repository. Point at them with
#   HOROVOD_SRC=/path/to/horovod            a checkout (its test/ is read), or
#   HOROVOD_GIT_DIR=/path/to/horovod.git    a git directory (HOROVOD_REF, default HEAD);
# with neither, the script clones github.com/horovod/horovod (depth 1).
# GPU tests are deselected (-k "not gpu"; HOROVOD_TEST_K overrides).
# PER_TEST_TIMEOUT (s, default 180; pytest-timeout) and TOTAL_TIMEOUT (s,
# default 1500) bound a hang.
# Each rank writes OUT_DIR/rank<N>.log and OUT_DIR/rank<N>.xml (junit);
# the summary printed at the end is rank 0's, with any test whose outcome
# differs on rank 1 named.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
np=${NP:-2}
out=${OUT_DIR:-$(mktemp -d /tmp/hvdtf.XXXXXX)}
mkdir -p "$out"
py=${PYTHON:-python}
mpirun=${MPIRUN:-mpirun}
per_test_timeout=${PER_TEST_TIMEOUT:-180}
total_timeout=${TOTAL_TIMEOUT:-1500}

# Horovod's tests, laid out as in its tree (test_tensorflow.py finds
# test/utils through a path relative to itself).
src="$out/horovod-test"
rm -rf "$src"; mkdir -p "$src/parallel" "$src/utils"
files="parallel/test_tensorflow.py parallel/base_test_tensorflow.py utils/common.py"
if [ -n "${HOROVOD_SRC:-}" ]; then
    for f in $files; do cp "$HOROVOD_SRC/test/$f" "$src/$f"; done
else
    gd=${HOROVOD_GIT_DIR:-}
    if [ -z "$gd" ]; then
        git clone -q --depth 1 --bare https://github.com/horovod/horovod "$out/horovod.git"
        gd="$out/horovod.git"
    fi
    for f in $files; do
        git --git-dir="$gd" show "${HOROVOD_REF:-HEAD}:test/$f" > "$src/$f"
    done
    echo "horovod commit: $(git --git-dir="$gd" rev-parse "${HOROVOD_REF:-HEAD}")"
fi

export PYTHONPATH="$here/shim:$repo${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# Horovod's tests are written for tf.keras being Keras 2 (they pass
# BatchNormalization(fused=False) and call Variable.ref()): KERAS=2, the
# default, runs them with tf_keras as tf.keras; KERAS=3 with TensorFlow's
# default Keras 3.
if [ "${KERAS:-2}" = 2 ]; then
    export TF_USE_LEGACY_KERAS=1
else
    export TF_USE_LEGACY_KERAS=0
fi
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-}

rc=0
timeout "$total_timeout" "$mpirun" --allow-run-as-root --oversubscribe -np "$np" \
    -x PYTHONPATH -x TF_USE_LEGACY_KERAS -x TF_CPP_MIN_LOG_LEVEL -x CUDA_VISIBLE_DEVICES \
    bash -c 'r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
        exec "$0" -m pytest -q -rfEs -p no:cacheprovider --timeout "$1" \
            -k "$2" --junitxml="$3/rank$r.xml" "${@:5}" "$4" > "$3/rank$r.log" 2>&1' \
    "$py" "$per_test_timeout" "${HOROVOD_TEST_K:-not gpu}" "$out" \
    "$src/parallel/test_tensorflow.py" "$@" || rc=$?

"$py" "$here/summarize.py" "$out"/rank*.xml || true
echo "logs: $out (exit $rc)"
exit "$rc"
