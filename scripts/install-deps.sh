#!/usr/bin/env bash
# Installs what headsum needs on Debian 12, as root, only if missing.
# Debian packages only: Highway 1.0.3, oneDNN 2.6.3 (its CMake config also
# needs OpenCL's), GoogleTest, Google Benchmark, gcc's OpenMP (libgomp).
# Open MPI (libopenmpi-dev, openmpi-bin) for headsum::mpi and its tests.
# Sourced (scripts/arm.sh), it only defines install_missing.

# install_missing [--quiet] NAME PACKAGE...: apt-get installs the PACKAGEs
# dpkg does not list as installed ("NAME: installing ..."; --quiet: without
# apt-get install's output).  Sets apt_updated=1 when it ran apt-get update.
install_missing() {
  local quiet=0 name p
  if [ "$1" = --quiet ]; then quiet=1; shift; fi
  name=$1
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  apt_updated=0
  [ ${#missing[@]} -ne 0 ] || return 0
  echo "$name: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt_updated=1
  if [ "$quiet" = 1 ]; then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
  else
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
set -euo pipefail
packages=(build-essential cmake libhwy-dev libdnnl-dev ocl-icd-opencl-dev libgtest-dev
          libbenchmark-dev libopenmpi-dev openmpi-bin python3 "$@")
install_missing install-deps "${packages[@]}"
