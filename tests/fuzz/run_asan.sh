#!/usr/bin/env bash
# Builds tests/fuzz/parsers_asan.cc with AddressSanitizer and UBSan against
# the parser sources and runs it: bash tests/fuzz/run_asan.sh [iterations]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${TFRING_FUZZ_BUILD:-build-fuzz}
mkdir -p "$OUT"
${CXX:-g++} -std=c++17 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
  -Icsrc -o "$OUT/parsers_asan" tests/fuzz/parsers_asan.cc \
  csrc/common/{wire,net,env,status,hmac,logging,types}.cc csrc/runtime/messages.cc \
  csrc/rendezvous/tcp_store.cc -lpthread
"$OUT/parsers_asan" "${1:-200000}"
