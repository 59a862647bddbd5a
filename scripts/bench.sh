#!/usr/bin/env bash
# Builds headsum and its benchmarks (Release), runs every kernel beside its
# oneDNN twin with pinned threads, prints the comparison table and writes a
# plot of GFLOP/s against sequence length.  Extra arguments go to
# scripts/bench_table.py (e.g. --repetitions 5, --filter attention).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh python3-matplotlib
build=${HEADSUM_BUILD_DIR:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHEADSUM_BUILD_TESTS=OFF
cmake --build "$build" -j"$(nproc)" --target headsum_bench
export OMP_PROC_BIND=true OMP_PLACES=cores
python3 scripts/bench_table.py --bench "$build/bench/headsum_bench" --plot bench-results.png "$@"
cmake --build "$build" -j"$(nproc)" --target headsum_per_head_bench
python3 scripts/per_head_table.py --bench "$build/bench/headsum_per_head_bench"
