#!/usr/bin/env bash
# Installs what headsum needs on Debian 12, as root, only if missing.
# Debian packages only: Highway 1.0.3, oneDNN 2.6.3 (its CMake config also
# needs OpenCL's), GoogleTest, Google Benchmark, gcc's OpenMP (libgomp).
# Open MPI (libopenmpi-dev, openmpi-bin) for headsum::mpi and its tests.
set -euo pipefail
packages=(build-essential cmake libhwy-dev libdnnl-dev ocl-icd-opencl-dev libgtest-dev
          libbenchmark-dev libopenmpi-dev openmpi-bin python3 "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
