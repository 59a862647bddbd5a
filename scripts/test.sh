#!/usr/bin/env bash
# Builds headsum (Release, every Highway target) and runs the whole test
# suite: every kernel on every target this CPU runs, the oneDNN equivalence,
# argument validation, determinism and the installed-package consumer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${HEADSUM_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHEADSUM_BUILD_BENCH=OFF
cmake --build "$build" -j"$(nproc)"
# OpenMP threads that spin while waiting fight ctest -j for the cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
