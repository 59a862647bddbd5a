// The plain (baseline-compiled) part of the native paths: run-time
// detection, the list of compiled paths, 16-bit conversions and the merge of
// key-split partials.
#include <math.h>
#include <string.h>

#include <limits>
#include <mutex>

#include "kernels/native/native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace headsum {
namespace native {

// Defined by the per-instruction-set files the build compiled.
#if defined(HEADSUM_NATIVE_AMX_BF16)
const Path* AmxBf16Path();
const Path* AmxBf16EmulatedPath();
#endif
#if defined(HEADSUM_NATIVE_AVX512_BF16)
const Path* Avx512Bf16Path();
#endif
#if defined(HEADSUM_NATIVE_NEON_BF16)
const Path* NeonBf16Path();
#endif

const Path* const* CompiledPaths() {
  static const Path* const paths[] = {
#if defined(HEADSUM_NATIVE_AMX_BF16)
      AmxBf16Path(),
#endif
#if defined(HEADSUM_NATIVE_AVX512_BF16)
      Avx512Bf16Path(),
#endif
#if defined(HEADSUM_NATIVE_NEON_BF16)
      NeonBf16Path(),
#endif
      nullptr};
  return paths;
}

const Path* PathByName(const char* name) {
  if (name == nullptr) return nullptr;
  for (const Path* const* p = CompiledPaths(); *p != nullptr; ++p) {
    if (strcmp((*p)->name, name) == 0) return *p;
  }
  return nullptr;
}

const Path* AmxEmulatedPath() {
#if defined(HEADSUM_NATIVE_AMX_BF16)
  return AmxBf16EmulatedPath();
#else
  return nullptr;
#endif
}

// ---------------------------------------------------------------------------
// Detection.

#if defined(__x86_64__) || defined(_M_X64)
namespace {

struct CpuidRegs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

CpuidRegs Cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = CpuidRegs();
  return r;
}

// XCR0: which register states the OS saves (0 when XGETBV is unavailable).
unsigned long long Xcr0() {
  const CpuidRegs l1 = Cpuid(1, 0);
  if ((l1.c & (1u << 27)) == 0) return 0;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

bool Avx512Bf16Detected() {
  const unsigned long long xcr0 = Xcr0();
  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state enabled by the OS.
  if ((xcr0 & 0xE6) != 0xE6) return false;
  const CpuidRegs l7 = Cpuid(7, 0);
  const bool f = (l7.b >> 16) & 1, bw = (l7.b >> 30) & 1, vl = (l7.b >> 31) & 1;
  if (!(f && bw && vl)) return false;
  if (l7.a < 1) return false;  // no subleaf 1
  const CpuidRegs l71 = Cpuid(7, 1);
  return (l71.a >> 5) & 1;  // AVX512_BF16
}

bool AmxDetectedAndPermitted() {
  if (!Avx512Bf16Detected()) return false;
  const CpuidRegs l7 = Cpuid(7, 0);
  const bool amx_bf16 = (l7.d >> 22) & 1, amx_tile = (l7.d >> 24) & 1;
  if (!(amx_bf16 && amx_tile)) return false;
  // XTILECFG (17) and XTILEDATA (18) must be OS-enabled in XCR0.
  if ((Xcr0() & (3ull << 17)) != (3ull << 17)) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  // Linux hands the 8 KiB tile state to a process only on request; without
  // it the first tile instruction raises SIGILL.  Asked once per process.
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace

bool CpuHasAvx512Bf16() {
  static const bool has = Avx512Bf16Detected();
  return has;
}
bool CpuHasAmxBf16() {
  static const bool has = AmxDetectedAndPermitted();  // thread-safe, once
  return has;
}
#else
bool CpuHasAvx512Bf16() { return false; }
bool CpuHasAmxBf16() { return false; }
#endif

bool CpuHasArmBf16() {
#if defined(__aarch64__) && defined(__linux__)
  constexpr unsigned long kHwcap2Bf16 = 1ul << 14;  // HWCAP2_BF16
  static const bool has = (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
  return has;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------
// Conversions.

namespace {
uint32_t Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
}  // namespace

uint16_t F32ToBf16(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float Bf16ToF32(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

uint16_t F32ToF16(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below f16's smallest normal: subnormal or 0
    // Scale so that the f16 subnormal step 2^-24 is one unit, round to
    // nearest even in f32 arithmetic (exact: the result fits 11 bits).
    const float scaled = FromBits(abs) * 16777216.0f;  // 2^24
    const float r = nearbyintf(scaled);  // default rounding mode: to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias the exponent (127 -> 15) and round the mantissa 23 -> 10.
  const uint32_t rebased = abs - (112u << 23);
  const uint32_t rounding = 0xFFFu + ((rebased >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24, exact
    return sign ? -mag : mag;
  }
  if (exp == 31) return FromBits(sign | 0x7F800000u | (man << 13));
  return FromBits(sign | ((exp + 112u) << 23) | (man << 13));
}

void StoreRow(const float* src, size_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::kF32:
      memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
  }
}

void MergePartials(const AttnDims& a, const float* partials, size_t splits,
                   const TensorView& out, size_t b, size_t h, size_t i0, size_t i1) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim, rows = i1 - i0, stride = PartialFloats(a);
  // A row of up to a few hundred floats; the head dims the API takes are
  // bounded only by memory, so the row is built in chunks of kChunk.
  constexpr size_t kChunk = 256;
  float row[kChunk];
  for (size_t r = 0; r < rows; ++r) {
    float m_all = kNegInf;
    bool nan = false;
    for (size_t c = 0; c < splits; ++c) {
      const float m = partials[(c * rows + r) * stride + L];
      nan |= isnan(m);
      m_all = m > m_all ? m : m_all;
    }
    // A sink (base 2) joins the denominator: the max then takes it too.
    const bool sink = a.opt != nullptr && a.opt->sinks != nullptr;
    const float sink2 = sink ? kLog2e * a.opt->sinks[a.query_head(h, i0 + r)] : kNegInf;
    const float m_keys = m_all;
    if (sink && sink2 > m_all) m_all = sink2;
    float l_all = sink && !nan ? exp2f(sink2 - m_all) : 0.0f;
    if (!nan && m_keys != kNegInf) {
      for (size_t c = 0; c < splits; ++c) {
        const float* rec = partials + (c * rows + r) * stride;
        if (rec[L] == kNegInf) continue;
        l_all += exp2f(rec[L] - m_all) * rec[L + 1];
      }
    }
    char* dst = out.Row(b, h, i0 + r);
    for (size_t l0 = 0; l0 < L; l0 += kChunk) {
      const size_t n = L - l0 < kChunk ? L - l0 : kChunk;
      for (size_t l = 0; l < n; ++l) row[l] = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      if (!nan && m_keys != kNegInf) {
        for (size_t c = 0; c < splits; ++c) {
          const float* rec = partials + (c * rows + r) * stride;
          if (rec[L] == kNegInf) continue;
          const float w = exp2f(rec[L] - m_all);
          for (size_t l = 0; l < n; ++l) row[l] += w * rec[l0 + l];
        }
        const float inv = 1.0f / l_all;
        for (size_t l = 0; l < n; ++l) row[l] *= inv;
      }
      StoreRow(row, n, out.dtype, dst + l0 * DTypeBytes(out.dtype));
    }
  }
}

}  // namespace native
}  // namespace headsum
