# Target policy: compile every Highway target the compiler can build for this
# architecture (HWY_COMPILE_ALL_ATTAINABLE keeps the SSSE3/SSE4 and SCALAR
# fallbacks that the default policy would drop).  Dispatch picks among them
# at run time.  Not AVX3_DL, which Highway 1.0.3 builds only on request
# (HWY_WANT_AVX3_DL): AVX3 plus VNNI, VBMI/VBMI2, BITALG, VAES and
# VPCLMULQDQ, none of which these f32 kernels use, so it compiled the same
# work a sixth time for nothing.  Measured on an Emerald Rapids class VM
# (one thread, HEADSUM_TARGET=AVX3_DL vs AVX3, two alternated runs, medians):
# attention S=512 f32 4.57/4.50 ms, projection S=20 75.4/72.3 us and S=512
# 1.94/1.94 ms, f16 and bf16 K/V prefill S=512 4.51-4.71/4.45-4.73 ms, a
# bf16 decode step over 4096 keys 326-369/328-337 us: equal within the runs'
# spread.  Leaving it out cut the library's Release build by a sixth of its
# kernel units' time.
set(HEADSUM_HWY_DEFINITIONS HWY_COMPILE_ALL_ATTAINABLE)

# Targets to leave out, as Highway's HWY_DISABLED_TARGETS expression, e.g.
# "(HWY_SSSE3|HWY_SSE4)".  Empty (the default): every attainable target.  The
# fuzz build keeps AVX2 and SCALAR only: the C API's checks do not depend on
# the target, and clang with ASan takes several times as long per target.
set(HEADSUM_HWY_DISABLED_TARGETS "" CACHE STRING
    "Highway targets not to compile (a HWY_DISABLED_TARGETS expression)")
if(HEADSUM_HWY_DISABLED_TARGETS)
  list(APPEND HEADSUM_HWY_DEFINITIONS "HWY_DISABLED_TARGETS=${HEADSUM_HWY_DISABLED_TARGETS}")
endif()
