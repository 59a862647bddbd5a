#!/usr/bin/env bash
# Cross-builds headsum for 64-bit Arm (aarch64) on a Debian 12 x86-64 host and
# runs the test suite under qemu user-mode emulation, once per emulated CPU,
# so that every Arm target Highway compiles (NEON, SVE, SVE2, SVE_256,
# SVE2_128, and the SCALAR fallback) runs somewhere:
#
#   QEMU_CPU        what it emulates          targets that run (+ NEON, SCALAR)
#   cortex-a72      NEON only                 -
#   max,sve128=on   SVE2, 128-bit vectors     SVE2_128, SVE2, SVE
#   max,sve256=on   SVE2, 256-bit vectors     SVE_256, SVE2, SVE
#   max             SVE2, 512-bit vectors     SVE2, SVE
#
# Tests of a target the emulated CPU cannot run skip.  A target's code is the
# same under every CPU that runs it at one vector length, and qemu runs SVE
# code at 256 and 512 bits about 11x as slowly as at 128 (one kernel test:
# 5.5 s under cortex-a72 on NEON and under max,sve128=on on SVE or SVE2_128,
# 60 s under max,sve256=on on SVE and under max on SVE2), so
# HEADSUM_ARM_ALL_TARGETS=0 (what .ci/run uses) runs each target's kernel
# tests under one CPU, every target whole at its narrowest length (but SVE2,
# whose 128-bit code SVE and SVE2_128 cover, and SCALAR, the portable code
# x86 runs whole: their reference checks) and the kernels' reference checks
# again at 256 and 512 bits:
#
#   cortex-a72      NEON                               everything
#                   SCALAR                             the reference checks
#   max,sve128=on   SVE2_128, SVE, NEON_BF16           everything (128-bit)
#                   SVE2                               the reference checks
#   max,sve256=on   SVE_256 (its only length)          the reference checks
#   max             SVE                                the reference checks (512-bit)
#
# The reference checks: every kernel against the double reference (small
# sweep): attention, qk_scores, softmax_v, fully masked rows, the projection
# plain, packed and gated with its per-head outputs, the contribution norms
# and attribution, the tensor attention over every dtype and layout, the
# dtype conversion, and the layer's prefill and decode steps (rotary
# positions, KV cache); of the tensor projection (16-bit Wo, strides) only
# its f32 core, the projection above (the whole test takes ~190 s there).
# On NEON_BF16 the f32-only suites are left out (they run the best Highway
# target there, SVE2_128, which runs them as Targets/.../SVE2_128).  The
# tests that are not per target (API, validation, layer, examples) run under
# cortex-a72 and max,sve128=on, on their best targets
# (HEADSUM_ARM_ALL_TARGETS=1: under every CPU, and every target under every
# CPU that runs it).  The kernel tests use the small shape sweep
# (HEADSUM_TEST_SWEEP=small; =full for the whole sweep, several times as long
# under qemu).  The benchmark is built but not run: qemu timings say nothing
# about an Arm CPU.
#
# Installs what it needs first (arm64 multiarch packages beside the amd64
# ones, the cross compiler, qemu-user-static; only what is missing).  Builds
# without oneDNN (-DHEADSUM_WITH_ONEDNN=OFF; its tests skip): libdnnl-dev:arm64
# would bring some 67 more arm64 packages (Mesa, LLVM) and lift amd64 ones to
# the same versions, for reference paths that are checked on x86 already.
# HEADSUM_ARM_BUILD_DIR (default build-arm), HEADSUM_ARM_CPUS (a space
# separated list of QEMU_CPU values) override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
build=${HEADSUM_ARM_BUILD_DIR:-build-arm}
jobs=$(nproc)
read -r -a cpus <<< "${HEADSUM_ARM_CPUS:-cortex-a72 max,sve128=on max,sve256=on max}"
toolchain=$PWD/cmake/toolchains/aarch64-linux-gnu.cmake

# ---- 1. packages ----------------------------------------------------------------
packages=(cmake make python3 pkgconf g++-aarch64-linux-gnu qemu-user-static
          libhwy-dev:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64 libgomp1:arm64)
update=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  update=1
fi
source scripts/install-deps.sh  # install_missing
install_missing --quiet arm "${packages[@]}"
[ "$update" = 0 ] || [ "$apt_updated" = 1 ] || apt-get update -qq
t_installed=$(date +%s)

# ---- 2. build -------------------------------------------------------------------
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_BUILD_TYPE=Release \
  -DHEADSUM_WITH_ONEDNN=OFF -DHEADSUM_BUILD_TESTS=ON -DHEADSUM_BUILD_BENCH=ON \
  -DHEADSUM_BUILD_EXAMPLES=ON > /dev/null
cmake --build "$build" -j"$jobs"
t_built=$(date +%s)
# The benchmark is built, and the aarch64 loader finds every library it needs
# (running it, even --benchmark_list_tests, first measures the FMA peak:
# ~40 s under qemu, and meaningless there).
if deps=$(qemu-aarch64-static /lib/ld-linux-aarch64.so.1 --list "$build/bench/headsum_bench") &&
   ! grep -q "not found" <<< "$deps"; then
  echo "arm: headsum_bench built for aarch64, its libraries resolve (not run under qemu)"
else
  echo "arm: FAIL: headsum_bench's libraries do not resolve under qemu:"; echo "$deps"; exit 1
fi

# ---- 3. the installed package, used by an Arm consumer --------------------------
# find_package(headsum) from the examples as a separate project, and a plain
# C program linked with pkg-config's flags; both run under qemu.
pkg=$(realpath -m "$build/package-test-arm")
rm -rf "$pkg"
cmake --install "$build" --prefix "$pkg/prefix" > /dev/null
cmake -S examples -B "$pkg/examples" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$pkg/prefix" > /dev/null
cmake --build "$pkg/examples" -j"$jobs" > /dev/null
QEMU_CPU=max qemu-aarch64-static "$pkg/examples/attention_layer"
pcdir=$(dirname "$(find "$pkg/prefix" -name headsum.pc -print -quit)")
pcflags=$(PKG_CONFIG_LIBDIR="$pcdir:/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig" \
          pkg-config --cflags --libs --static headsum)
# shellcheck disable=SC2086  # the flags are words
aarch64-linux-gnu-gcc -O2 examples/attention_layer.c $pcflags -o "$pkg/attention_layer_pc"
QEMU_CPU=cortex-a72 qemu-aarch64-static "$pkg/attention_layer_pc"
echo "arm: installed package OK (find_package and pkg-config: $pcflags)"
t_package=$(date +%s)

# ---- 4. the test suite under each emulated CPU ----------------------------------
export HEADSUM_TEST_SWEEP=${HEADSUM_TEST_SWEEP:-small}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# HEADSUM_ARM_ALL_TARGETS=0: the suites that only make f32 calls (left out on
# NEON_BF16), and the reference checks run at the wider vector lengths.
. scripts/f32_only_suites.sh
reference_checks='(Attention\.EqualsSoftmaxOfScaledQKTransposeTimesV|QkScores\.EqualsScaledQKTransposeWithMinusInfWhereMasked|SoftmaxV\.EqualsSoftmaxAlongKeysTimesV|ProjectHeadsSum\.EqualsConcatThenGemmReference|ProjectHeadsSumPacked\.EqualsReferenceAndPlainCallBitwise|ProjectHeadsSumEx\.EqualsGatedSumOfHeadContributions|HeadContributionNorms\.EqualsNormsOfHeadContributions|HeadAttribution\.EqualsContributionsDottedWithDirections|FullyMaskedRows\.[A-Za-z]+|TensorAttention\.EveryDtypeAndLayoutMatchesReference|TensorConvert\.BitExactOnTiesSubnormalsNanOverflowAndSignedZero|LayerCache\.PrefillThenDecodeStepsMatchReference)'
# "|^Targets/(A|B|...)/TARGET( |$)": target's per-target tests that are not
# reference checks (nothing when there are none).
rest_of() {
  local rest
  rest=$(ctest --test-dir "$build" -N |
         sed -n "s|^ *Test *#[0-9]*: Targets/\\([A-Za-z0-9_]*\\.[A-Za-z0-9_]*\\)/$1 .*|\\1|p" |
         grep -Ev "^$reference_checks\$" | sed 's/[.]/\\./g' | paste -sd'|' || true)
  [ -z "$rest" ] || echo "|^Targets/($rest)/$1( |\$)"
}
logs=$build/qemu-logs
mkdir -p "$logs"
failed_cpus=()
first=1
for cpu in "${cpus[@]}"; do
  label=${cpu//,/-}; label=${label//=on/}
  # The package_* tests build host-compiler consumers: not for a cross build.
  exclude='^package_'
  only=()
  if [ "${HEADSUM_ARM_ALL_TARGETS:-1}" = 0 ]; then
    case "$cpu" in
      cortex-a72)
        exclude+='|/(SVE|SVE2|SVE_256|SVE2_128|NEON_BF16)( |$)'
        # SCALAR only for the reference checks: its code is the portable
        # C++ that scripts/test.sh and scripts/sanitize.sh run whole on x86,
        # and an Arm CPU always has NEON (it runs only when forced); the
        # checks catch what this compiler does differently (it contracts
        # a * b + c into fmadd).  With the small sweep's thread counts: 181 -> 82 s
        # under cortex-a72 on a 2-core Zen 3 VM.
        exclude+=$(rest_of SCALAR) ;;
      max,sve128=on)
        exclude+="|/(NEON|SCALAR|SVE_256)( |\$)|^Targets/$f32_only_suites\\.[A-Za-z]+/NEON_BF16( |\$)"
        # SVE2 (scalable) only for the reference checks: at 128 bits it is
        # SVE's code but for a few instructions, and SVE2_128 runs every SVE2
        # test whole (saves ~95 s of the CI's time).
        exclude+=$(rest_of SVE2) ;;
      max,sve256=on) only=(-R "^Targets/$reference_checks/SVE_256( |\$)") ;;
      max)           only=(-R "^Targets/$reference_checks/SVE( |\$)") ;;
      *) if [ "$first" = 0 ]; then exclude+='|/(NEON|SCALAR)( |$)'; fi ;;
    esac
  fi
  first=0
  echo "arm: ctest under QEMU_CPU=$cpu"
  t0=$(date +%s)
  rc=0
  # The reference checks at 256 and 512 bits on the tiny sweep (tests/shapes.h:
  # the small sweep's first draw of shapes, a quarter of TensorAttention's
  # dtype combinations; all of them run at 128 bits): under max,sve256=on
  # 109 -> 50 s on a 2-core Emerald Rapids class VM.
  sweep=$HEADSUM_TEST_SWEEP
  if [ "${HEADSUM_ARM_ALL_TARGETS:-1}" = 0 ] && [ "$sweep" = small ]; then
    case "$cpu" in max,sve256=on|max) sweep=tiny ;; esac
  fi
  QEMU_CPU=$cpu HEADSUM_TEST_SWEEP=$sweep ctest --test-dir "$build" -j"$jobs" --output-on-failure \
    -E "$exclude" "${only[@]}" > "$logs/$label.log" 2>&1 || rc=$?
  echo "$(( $(date +%s) - t0 )) $rc" > "$logs/$label.time"
  if [ "$rc" -ne 0 ]; then
    failed_cpus+=("$cpu")
    sed -n '/The following tests FAILED/,$p' "$logs/$label.log"
  fi
done
t_end=$(date +%s)

# ---- 5. summary: per CPU, and which targets ran where ---------------------------
python3 - "$logs" "${cpus[@]}" <<'EOF'
import collections, re, sys
logs, cpus = sys.argv[1], sys.argv[2:]
targets = ["NEON", "SVE", "SVE2", "SVE_256", "SVE2_128", "NEON_BF16", "SCALAR"]
line_re = re.compile(r'Test +#\d+: (\S+).*?(Passed|Skipped|Failed|Timeout|Exception|Not Run)'
                     r'.*?([\d.]+) sec')
cells, rows = {}, []
for cpu in cpus:
    label = cpu.replace(",", "-").replace("=on", "")
    try:
        text = open(f"{logs}/{label}.log", errors="replace").read().splitlines()
        seconds, rc = open(f"{logs}/{label}.time").read().split()
    except OSError:
        text, seconds, rc = [], "?", "?"
    total = collections.Counter()
    per_target = collections.defaultdict(collections.Counter)
    for line in text:
        m = line_re.search(line)
        if not m:
            continue
        status = {"Passed": "passed", "Skipped": "skipped"}.get(m.group(2), "failed")
        total[status] += 1
        target = m.group(1).rsplit("/", 1)[-1]
        if target in targets and "/" in m.group(1):
            per_target[target][status] += 1
    rows.append(f"  {cpu:15s} {seconds:>4s} s  {total['passed']:4d} passed, {total['failed']:3d} failed,"
                f" {total['skipped']:4d} skipped" + ("" if rc == "0" else f"  (ctest exit {rc})"))
    for t in targets:
        s = per_target.get(t)
        if not s:
            cells[cpu, t] = "-"
        elif s["passed"] + s["failed"] == 0:
            cells[cpu, t] = "skip"
        else:
            cells[cpu, t] = f"{s['passed']}/{s['passed'] + s['failed']}"
print("\narm: ctest per emulated CPU (logs in %s/)" % logs)
print("\n".join(rows))
print("\narm: kernel tests per Highway target and CPU: passed/run (a test that skips for")
print("     another reason, e.g. no oneDNN, is not counted); skip: this CPU cannot run the")
print("     target; -: not run here (HEADSUM_ARM_ALL_TARGETS=0), the same code ran under another CPU")
width = max(len(c) for c in cpus) + 2
print("  " + "target".ljust(10) + "".join(c.ljust(width) for c in cpus))
for t in targets:
    print("  " + t.ljust(10) + "".join(cells[c, t].ljust(width) for c in cpus))
EOF
echo
echo "arm: times: install $((t_installed - t_start)) s, build $((t_built - t_installed)) s," \
     "package $((t_package - t_built)) s, tests $((t_end - t_package)) s," \
     "total $((t_end - t_start)) s"
if [ ${#failed_cpus[@]} -ne 0 ]; then
  echo "arm: FAILED under: ${failed_cpus[*]}"
  exit 1
fi
echo "arm: all tests passed under every emulated CPU"
