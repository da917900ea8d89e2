#!/usr/bin/env bash
# Builds tests/fuzz/parsers_asan.cc with AddressSanitizer and UBSan against
# the parser sources and runs it: bash tests/fuzz/run_asan.sh [iterations]
#
# TFRING_FUZZ_BUILD: the output directory (default build-fuzz); the binary
# is rebuilt only when a source is newer. TFRING_FUZZ_BUILD_ONLY=1 builds
# without running (./dev.sh test does so in the background). Concurrent
# builds into one directory take turns (flock, where it exists).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${TFRING_FUZZ_BUILD:-build-fuzz}
mkdir -p "$OUT"
SRCS=(tests/fuzz/parsers_asan.cc csrc/common/{wire,net,env,tunables,status,hmac,logging,types}.cc
      csrc/runtime/messages.cc csrc/rendezvous/tcp_store.cc)
BIN="$OUT/parsers_asan"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$OUT/.build.lock"
  flock 9
fi
# Built when missing, or older than any source or header it may include.
if [[ ! -x "$BIN" || -n "$(find tests/fuzz csrc -newer "$BIN" \( -name '*.cc' -o -name '*.h' \) \
                             -print -quit)" ]]; then
  ${CXX:-g++} -std=c++17 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Icsrc -o "$BIN.tmp" "${SRCS[@]}" -lpthread
  mv -f "$BIN.tmp" "$BIN"
fi
if command -v flock >/dev/null 2>&1; then exec 9>&-; fi
[[ "${TFRING_FUZZ_BUILD_ONLY:-0}" == 1 ]] && exit 0
"$BIN" "${1:-200000}"
