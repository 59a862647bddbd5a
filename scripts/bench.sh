#!/usr/bin/env bash
# Builds headsum and its benchmarks (Release), runs every kernel beside its
# oneDNN twin -- each row with 64-byte-aligned buffers and with buffers 16
# bytes off (as std::vector / glibc malloc gives), and the whole run twice:
# OpenMP threads pinned (OMP_PROC_BIND=true OMP_PLACES=cores) and unpinned
# (OMP_PROC_BIND=false) -- prints the comparison tables and draws
# bench-results.png (scripts/bench.py kernels), then the per-head costs
# (scripts/bench.py per-head).  Extra arguments go to `bench.py kernels`
# (e.g. --repetitions 5, --filter attention, --bind pinned, --interleave).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh python3-matplotlib
build=${HEADSUM_BUILD_DIR:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHEADSUM_BUILD_TESTS=OFF
cmake --build "$build" -j"$(nproc)" --target headsum_bench

# The interpreter that draws the PNG: `python3` when it has matplotlib, else
# Debian's /usr/bin/python3 (python3-matplotlib, installed above), else a
# venv of `python3` with matplotlib from pip.  `python3` may be a pyenv or
# other interpreter that does not see Debian's packages.
has_matplotlib() { command -v "$1" >/dev/null 2>&1 && "$1" -c 'import matplotlib' 2>/dev/null; }
python=
for candidate in python3 /usr/bin/python3; do
  if has_matplotlib "$candidate"; then python=$candidate; break; fi
done
if [ -z "$python" ]; then
  venv="$build/plot-venv"
  echo "bench.sh: no python3 with matplotlib; installing it into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet matplotlib
  python="$venv/bin/python"
fi
echo "bench.sh: plotting with $python ($("$python" -c 'import matplotlib, sys; print(sys.version.split()[0], "matplotlib", matplotlib.__version__)'))" >&2

rm -f bench-results.png
"$python" scripts/bench.py kernels --bench "$build/bench/headsum_bench" \
  --plot bench-results.png --require-png "$@"
if [ ! -s bench-results.png ]; then
  echo "bench.sh: bench-results.png was not written" >&2
  exit 1
fi

cmake --build "$build" -j"$(nproc)" --target headsum_per_head_bench
OMP_PROC_BIND=true OMP_PLACES=cores \
  "$python" scripts/bench.py per-head --bench "$build/bench/headsum_per_head_bench"
