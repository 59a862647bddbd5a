#!/usr/bin/env bash
# The smallest build, for edge devices and embedders: no oneDNN, no OpenMP
# (-DHEADSUM_WITH_ONEDNN=OFF -DHEADSUM_WITH_OPENMP=OFF).  Builds it, runs the
# whole test suite (the oneDNN tests skip), checks that libheadsum.a then
# needs nothing but libhwy and the C++ runtime, and links a plain C program
# (examples/attention_layer.c) against the installed library with pkg-config
# alone:  cc app.c $(pkg-config --cflags --libs --static headsum)
#
# The same pkg-config check then runs on the default configuration (OpenMP
# and oneDNN on), reusing the build of scripts/test.sh ($HEADSUM_BUILD_DIR,
# default build/) when there is one, else building only the library in
# build-minimal-default/.  HEADSUM_MINIMAL_SKIP_FULL=1 skips that part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh pkgconf
build=${HEADSUM_MINIMAL_BUILD_DIR:-build-minimal}
full=${HEADSUM_BUILD_DIR:-build}
jobs=$(nproc)

# AVX3 and SCALAR only (HEADSUM_HWY_DISABLED_TARGETS): this build checks what
# the library needs without oneDNN and OpenMP, and that the suite passes on
# the serial path; every target runs in scripts/test.sh.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHEADSUM_WITH_ONEDNN=OFF \
  -DHEADSUM_WITH_OPENMP=OFF -DHEADSUM_BUILD_BENCH=OFF -DHEADSUM_WITH_MPI=OFF \
  "-DHEADSUM_HWY_DISABLED_TARGETS=(HWY_AVX3_DL|HWY_AVX2|HWY_SSE4|HWY_SSSE3)"
cmake --build "$build" -j"$jobs"
# The kernel tests on the small shape sweep (every tail a vector length
# leaves; HEADSUM_TEST_SWEEP=full for the whole one): what this build
# changes is the threading (no OpenMP) and the missing oneDNN, not the
# kernels, whose full sweep runs on every target in scripts/test.sh.
HEADSUM_TEST_SWEEP=${HEADSUM_TEST_SWEEP:-small} \
  ctest --test-dir "$build" --output-on-failure -j"$jobs"

# 1. The minimal library's undefined symbols: none from OpenMP or oneDNN, and
#    a C program links with -lhwy -lstdc++ -lm and nothing else.
echo "minimal: checking what libheadsum.a needs"
lib="$build/libheadsum.a"
undefined=$(nm -u --no-sort "$lib" | awk 'NF == 2 {print $2}' | sort -u)
defined=$(nm --defined-only "$lib" | awk 'NF == 3 {print $3}' | sort -u)
external=$(comm -23 <(echo "$undefined") <(echo "$defined"))
if grep -E '^(GOMP_|omp_|dnnl_|_ZN4dnnl)' <<< "$external"; then
  echo "minimal: FAIL: libheadsum.a refers to OpenMP or oneDNN symbols (above)"
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -Iinclude examples/attention_layer.c "$lib" -lhwy -lstdc++ -lm \
  -o "$work/minimal_app"
needed=$(readelf -d "$work/minimal_app" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "minimal: a C program links with -lhwy -lstdc++ -lm; it needs: $needed"
for n in $needed; do
  case "$n" in
    libhwy.so*|libstdc++.so*|libm.so*|libc.so*|libgcc_s.so*|ld-linux*) ;;
    *) echo "minimal: FAIL: unexpected dependency $n"; exit 1 ;;
  esac
done
"$work/minimal_app"

# 2. pkg-config: install into a scratch prefix, build the C example with
#    nothing but pkg-config's flags, run it.
pkgconfig_check() {  # build_dir label
  local prefix="$work/prefix-$2"
  cmake --install "$1" --prefix "$prefix" > /dev/null
  local pcdir
  pcdir=$(dirname "$(find "$prefix" -name headsum.pc -print -quit)")
  local flags
  flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs --static headsum)
  echo "pkg-config ($2): $flags"
  # shellcheck disable=SC2086  # the flags are words
  cc -O2 examples/attention_layer.c $flags -o "$work/attention_layer_$2"
  "$work/attention_layer_$2"
}
pkgconfig_check "$build" minimal

if [ "${HEADSUM_MINIMAL_SKIP_FULL:-0}" != 1 ]; then
  if [ ! -f "$full/CMakeCache.txt" ]; then
    # Not $full itself: its cached options would then hold for scripts/test.sh.
    full=$build-default
    cmake -S . -B "$full" -DCMAKE_BUILD_TYPE=Release -DHEADSUM_BUILD_TESTS=OFF \
      -DHEADSUM_BUILD_BENCH=OFF -DHEADSUM_BUILD_EXAMPLES=OFF
    # Every library it installs (headsum, and headsum_mpi where MPI is
    # found): nothing else is on in this configuration.
    cmake --build "$full" -j"$jobs"
  else
    cmake --build "$full" -j"$jobs" --target headsum
  fi
  pkgconfig_check "$full" default
fi
echo "minimal: OK"
