# Target policy: compile every Highway target the compiler can build for this
# architecture (HWY_COMPILE_ALL_ATTAINABLE keeps the SSSE3/SSE4 and SCALAR
# fallbacks that the default policy would drop), including AVX3_DL, which
# Highway 1.0.3 only builds on request.  Dispatch picks among them at run time.
set(HEADSUM_HWY_DEFINITIONS HWY_COMPILE_ALL_ATTAINABLE HWY_WANT_AVX3_DL)
