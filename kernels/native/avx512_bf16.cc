// AVX512_BF16: bf16 products on VDPBF16PS (x86 CPUs with AVX512_BF16:
// Cooper Lake, Sapphire Rapids and later Xeons, AMD Zen 4 and later).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16
// (cmake/HeadsumNative.cmake); the kernels are in x86_bf16-inl.h.
#include "kernels/native/x86_bf16-inl.h"

namespace headsum {
namespace native {
namespace {

bool Runs() { return CpuHasAvx512Bf16(); }

size_t AttentionScratch(const AttnDims& a) { return AttnScratchFloats(a); }

}  // namespace

const Path* Avx512Bf16Path() {
  static const Path path = {"AVX512_BF16", Runs, AttentionScratch, Avx512AttentionRows,
                            PackWoPanels, ProjScratchFloats, Avx512ProjectRows,
                            /*takes_options=*/true};
  return &path;
}

}  // namespace native
}  // namespace headsum
