#!/usr/bin/env bash
# Builds the library and every test with AddressSanitizer and
# UndefinedBehaviorSanitizer (-fno-sanitize-recover=all: any report fails)
# and runs the whole suite.  AVX3_DL and SSSE3 are left out of this build
# (HEADSUM_HWY_DISABLED_TARGETS): their kernels are AVX3's and SSE4's code
# (no instruction either adds is used), every target runs unsanitized in
# scripts/test.sh, and GCC with ASan takes minutes per target on attention.cc.
# On a CPU with AVX-512, AVX2 is left out as well: the sanitized targets
# are then AVX3 (16 lanes), SSE4 (4 lanes, where MaskedLoad is a full
# aligned load) and SCALAR (1), so every tail case a vector width leaves
# runs sanitized (AVX2's 8 lanes lie between), and the CI's time on 2
# cores stays within its budget (2831 s with AVX2 sanitized too, when the
# budget was 45 minutes; 30 now).
# On a CPU without AVX-512 (no avx512f in /proc/cpuinfo) AVX3 is left out
# too: every AVX3 test would skip there, and its sanitized compile is a third
# of this script's time on a 2-core Zen 1.
# HEADSUM_SANITIZE_ALL_TARGETS=1 builds all of them.
# The per-target kernel translation units (dispatch/attention.cc,
# projection.cc, convert.cc, rope.cc) are built without ASan's
# use-after-scope checks (HEADSUM_KERNEL_COMPILE_OPTIONS): with them GCC 12
# at -O1 took 282 s for attention.cc (AVX2, SSE4, SCALAR) and 385 s for
# projection.cc with AVX2 and SCALAR alone on the 2-core Zen 3 VM, without
# them 123 and 127 s.  Out-of-bounds reads and writes of the heap, the
# stack and globals are still checked everywhere, and scope checks stay on
# in the tests, the API and the layer (and in scripts/fuzz.sh, clang's,
# whole); every sanitized CI run before this change checked the kernels
# for it too, without a report.
# HEADSUM_SANITIZE_USE_AFTER_SCOPE=1 checks the kernels for it too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${HEADSUM_SANITIZE_BUILD_DIR:-build-sanitize}
disabled="(HWY_AVX3_DL|HWY_AVX2|HWY_SSSE3)"
if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  disabled="(HWY_AVX3|HWY_AVX3_DL|HWY_SSSE3)"
  echo "sanitize: this CPU has no AVX-512: AVX3 left out of the sanitized build (its tests would skip)"
fi
[ "${HEADSUM_SANITIZE_ALL_TARGETS:-0}" = 1 ] && disabled=""
kernel_options=-fno-sanitize-address-use-after-scope
[ "${HEADSUM_SANITIZE_USE_AFTER_SCOPE:-0}" = 1 ] && kernel_options=""
# -O1 -g1 (line tables: ASan's reports still name file and line): GCC with
# ASan at -O2 -g takes 549 s for dispatch/attention.cc alone on a Zen 1
# core, 221 s at -O1 -g1, and the sanitizers find the same errors.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADSUM_SANITIZE=address,undefined \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DHEADSUM_BUILD_BENCH=OFF "-DHEADSUM_HWY_DISABLED_TARGETS=$disabled" \
  "-DHEADSUM_KERNEL_COMPILE_OPTIONS=$kernel_options"
cmake --build "$build" -j"$(nproc)"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The kernel tests sweep the small shape list (HEADSUM_TEST_SWEEP=small: the
# seed and every Sq, Skv in {1, 17, 65}, causal and not, so every tail a
# vector length leaves, fully masked rows included): the sanitizers look for
# reads and writes out of bounds and undefined arithmetic, which the tails
# and the edges exercise; the full sweep's further sizes run unsanitized on
# every target in scripts/test.sh (and tests/guard_pages_test.cc puts each
# buffer against a protected page there).  HEADSUM_TEST_SWEEP=full for the
# whole sweep here too.
export HEADSUM_TEST_SWEEP=${HEADSUM_TEST_SWEEP:-small}
# oneDNN and libgomp are not instrumented; their one-time allocations are not leaks of ours.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The f32-only suites (their calls never take a native bf16 path) are left
# out on the native targets: there they run the f32 kernels of the best
# Highway target of this build (AVX3), which they already run as
# Targets/.../AVX3 (on a 2-core Sapphire Rapids VM at 2.0 GHz: 82 tests, ~6
# of the sanitized run's ~40 core-minutes).  Unsanitized, scripts/test.sh
# runs them all.
skip=""
if [ "${HEADSUM_SANITIZE_ALL_TARGETS:-0}" != 1 ]; then
  . scripts/f32_only_suites.sh
  skip="^Targets/$f32_only_suites\\.[A-Za-z]+/(AMX_BF16|AVX512_BF16) "
fi
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" ${skip:+-E "$skip"}
