#!/usr/bin/env bash
# ctest's package tests (tests/CMakeLists.txt): an installed headsum used by
# separate CMake projects through find_package(headsum CONFIG).
#
#   run.sh install BUILD_DIR PREFIX
#     cmake --install BUILD_DIR into a fresh PREFIX (the fixture that the
#     consumers share).
#   run.sh consumer PREFIX SOURCE_DIR WORK_DIR [-DOPTION...] [--run LAUNCHER...]
#     configures the consumer project SOURCE_DIR against PREFIX in a fresh
#     WORK_DIR (with the -D options), builds it and runs its program
#     `consumer`, through LAUNCHER when given (mpiexec -n 2 ...).
# A failing step prints its log.
set -euo pipefail

quiet() {  # log command...: runs the command, prints its log if it fails
  local log=$1; shift
  if ! "$@" > "$log" 2>&1; then
    cat "$log"
    echo "package test: FAILED: $*"
    exit 1
  fi
}

case "$1" in
  install)
    build_dir=$2 prefix=$3
    rm -rf "$prefix"
    mkdir -p "$prefix"
    quiet "$prefix.log" cmake --install "$build_dir" --prefix "$prefix"
    echo "installed into $prefix: $(cd "$prefix" && find . -name 'headsum*Targets.cmake' | sort | tr '\n' ' ')"
    ;;
  consumer)
    prefix=$2 source_dir=$3 work=$4
    shift 4
    options=()
    while [ $# -gt 0 ] && [ "$1" != --run ]; do options+=("$1"); shift; done
    [ $# -gt 0 ] && shift   # --run
    rm -rf "$work"
    mkdir -p "$work"
    quiet "$work/configure.log" cmake -S "$source_dir" -B "$work/build" \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release "${options[@]}"
    grep -E '^-- (consumer|headsum)' "$work/configure.log" || true
    quiet "$work/build.log" cmake --build "$work/build" -j2
    "$@" "$work/build/consumer"
    ;;
  *)
    echo "usage: run.sh install BUILD_DIR PREFIX | consumer PREFIX SOURCE_DIR WORK_DIR ..." >&2
    exit 2
    ;;
esac
