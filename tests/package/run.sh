#!/usr/bin/env bash
# ctest: install the built library into a scratch prefix, then build and run
# a consumer project that finds it with find_package(headsum CONFIG).
set -euo pipefail
build_dir=$1; source_dir=$2
prefix=$build_dir/package-test/prefix
rm -rf "$build_dir/package-test"
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
cmake -S "$source_dir/tests/package" -B "$build_dir/package-test/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build_dir/package-test/build" -j2 > /dev/null
"$build_dir/package-test/build/consumer_c"
"$build_dir/package-test/build/consumer_cpp"
