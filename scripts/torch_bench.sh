#!/usr/bin/env bash
# Runs a benchmark that compares headsum with PyTorch in one process
# (default bench/torch_variants_bench.py; any other bench/*.py that imports
# torch and headsum works the same) in a throwaway virtual environment
# (build-torch/venv, or HEADSUM_TORCH_VENV) holding this checkout's headsum
# (`pip install .`, every target) and torch from PyPI (its Linux wheel
# brings ~4.5 GB of CUDA libraries the CPU never uses; ~4 minutes).  The
# environment is kept between runs: delete it to start over.
#
#   bash scripts/torch_bench.sh [bench/other.py] [-- args for the script]
set -euo pipefail
cd "$(dirname "$0")/.."
script=bench/torch_variants_bench.py
if [ $# -gt 0 ] && [ "$1" != "--" ]; then script=$1; shift; fi
[ "${1:-}" != "--" ] || shift
bash scripts/install-deps.sh ninja-build python3-venv python3-dev
venv=$(realpath -m "${HEADSUM_TORCH_VENV:-build-torch/venv}")
python=${HEADSUM_PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch" 2> /dev/null; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch numpy
fi
# headsum from this checkout, rebuilt when the sources changed.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check .
cd /tmp  # import the installed package, not the checkout's python/ tree
"$venv/bin/python" "$OLDPWD/$script" "$@"
