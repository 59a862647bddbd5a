# Target policy: compile every Highway target the compiler can build for this
# architecture (HWY_COMPILE_ALL_ATTAINABLE keeps the SSSE3/SSE4 and SCALAR
# fallbacks that the default policy would drop), including AVX3_DL, which
# Highway 1.0.3 only builds on request.  Dispatch picks among them at run time.
set(HEADSUM_HWY_DEFINITIONS HWY_COMPILE_ALL_ATTAINABLE HWY_WANT_AVX3_DL)

# Targets to leave out, as Highway's HWY_DISABLED_TARGETS expression, e.g.
# "(HWY_SSSE3|HWY_SSE4)".  Empty (the default): every attainable target.  The
# fuzz build keeps AVX2 and SCALAR only: the C API's checks do not depend on
# the target, and clang with ASan takes several times as long per target.
set(HEADSUM_HWY_DISABLED_TARGETS "" CACHE STRING
    "Highway targets not to compile (a HWY_DISABLED_TARGETS expression)")
if(HEADSUM_HWY_DISABLED_TARGETS)
  list(APPEND HEADSUM_HWY_DEFINITIONS "HWY_DISABLED_TARGETS=${HEADSUM_HWY_DISABLED_TARGETS}")
endif()
