#!/usr/bin/env bash
# Builds the library and every test with AddressSanitizer and
# UndefinedBehaviorSanitizer (-fno-sanitize-recover=all: any report fails)
# and runs the whole suite.  AVX3_DL and SSSE3 are left out of this build
# (HEADSUM_HWY_DISABLED_TARGETS): their kernels are AVX3's and SSE4's code
# (no instruction either adds is used), every target runs unsanitized in
# scripts/test.sh, and GCC with ASan takes minutes per target on attention.cc.
# HEADSUM_SANITIZE_ALL_TARGETS=1 builds all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${HEADSUM_SANITIZE_BUILD_DIR:-build-sanitize}
disabled="(HWY_AVX3_DL|HWY_SSSE3)"
[ "${HEADSUM_SANITIZE_ALL_TARGETS:-0}" = 1 ] && disabled=""
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADSUM_SANITIZE=address,undefined \
  -DHEADSUM_BUILD_BENCH=OFF "-DHEADSUM_HWY_DISABLED_TARGETS=$disabled"
cmake --build "$build" -j"$(nproc)"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# oneDNN and libgomp are not instrumented; their one-time allocations are not leaks of ours.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
