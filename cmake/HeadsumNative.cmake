# The native bf16 paths (kernels/native/): one source per instruction set,
# each with its own -m flags, compiled only when the compiler takes them, so
# the rest of the library stays baseline.  Each compiled path defines
# HEADSUM_NATIVE_<NAME> for kernels/native/native_common.cc, which lists them.
include(CheckCXXCompilerFlag)

function(headsum_add_native_paths target)
  target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/kernels/native/native_common.cc)
  set(native_dir ${PROJECT_SOURCE_DIR}/kernels/native)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    # -fno-strict-aliasing: the kernels read bf16 buffers as u32 pairs.
    set(avx512_bf16_flags -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c
        -fno-strict-aliasing
        -Wno-maybe-uninitialized)  # GCC 12: false positives in its AVX-512 headers
    set(amx_flags ${avx512_bf16_flags} -mamx-tile -mamx-bf16)
    string(REPLACE ";" " " avx512_str "${avx512_bf16_flags}")
    string(REPLACE ";" " " amx_str "${amx_flags}")
    check_cxx_compiler_flag("${avx512_str}" HEADSUM_CXX_HAS_AVX512_BF16)
    check_cxx_compiler_flag("${amx_str}" HEADSUM_CXX_HAS_AMX_BF16)
    if(HEADSUM_CXX_HAS_AVX512_BF16)
      target_sources(${target} PRIVATE ${native_dir}/avx512_bf16.cc)
      set_source_files_properties(${native_dir}/avx512_bf16.cc PROPERTIES
                                  COMPILE_OPTIONS "${avx512_bf16_flags}")
      target_compile_definitions(${target} PRIVATE HEADSUM_NATIVE_AVX512_BF16=1)
      if(HEADSUM_CXX_HAS_AMX_BF16)
        target_sources(${target} PRIVATE ${native_dir}/amx_bf16.cc)
        set_source_files_properties(${native_dir}/amx_bf16.cc PROPERTIES
                                    COMPILE_OPTIONS "${amx_flags}")
        target_compile_definitions(${target} PRIVATE HEADSUM_NATIVE_AMX_BF16=1)
      endif()
    endif()
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
    # neon_bf16.cc marks its kernels with target("arch=armv8.6-a+bf16");
    # the rest of the file is baseline.
    include(CheckCXXSourceCompiles)
    check_cxx_source_compiles("
      #include <arm_neon.h>
      __attribute__((target(\"arch=armv8.6-a+bf16\")))
      float32x4_t f(float32x4_t a, bfloat16x8_t b) { return vbfdotq_f32(a, b, b); }
      int main() { return 0; }" HEADSUM_CXX_HAS_NEON_BF16)
    if(HEADSUM_CXX_HAS_NEON_BF16 AND EXISTS ${native_dir}/neon_bf16.cc)
      target_sources(${target} PRIVATE ${native_dir}/neon_bf16.cc)
      # The kernels read bf16 buffers as u32 pairs.
      set_source_files_properties(${native_dir}/neon_bf16.cc PROPERTIES
                                  COMPILE_OPTIONS "-fno-strict-aliasing")
      target_compile_definitions(${target} PRIVATE HEADSUM_NATIVE_NEON_BF16=1)
    endif()
  endif()
endfunction()
