// AMX_BF16: bf16 tile products (TDPBF16PS) on x86 CPUs with AMX (Sapphire
// Rapids and later Xeons).  Compiled with -mamx-tile -mamx-bf16 and the
// AVX-512 flags of avx512_bf16.cc (cmake/HeadsumNative.cmake): the softmax
// between the two tile products, the packing and the rows too few for a
// tile (a decode step) run on the AVX-512 code of x86_bf16-inl.h.
//
// Tiles: all eight 16 rows x 64 bytes (palette 1).  Attention: C tiles 0-3
// (S of 64 keys, then P V of 64 output columns), A tile 4 (a 32-dim chunk of
// Q, or a 32-key chunk of P), B tiles 6 and 7 in turn (K^T pairs, V pairs).
// Projection: C tiles 0-3 (32 rows x 32 columns), A tiles 4-5, B tiles 6-7.
// The tile configuration is loaded at the start of each work item and
// released (TILERELEASE) at its end, so no thread keeps tile state once a
// call's work is done.
//
// The kernels are templates over the tile operations: Hw issues the tile
// instructions; Emu models them in software (TDPBF16PS per its
// pseudo-code), so tests can check the packing and tile indexing on CPUs
// without AMX (AmxEmulatedPath in native.h).
#include "kernels/native/x86_bf16-inl.h"

namespace headsum {
namespace native {
namespace {

struct HwTiles {
  static void Configure() {
    alignas(64) uint8_t cfg[64] = {};
    cfg[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      cfg[16 + 2 * t] = 64;  // bytes per row (u16, little-endian)
      cfg[48 + t] = 16;      // rows
    }
    _tile_loadconfig(cfg);
  }
  static void Release() { _tile_release(); }
  // GCC's tile intrinsics paste the tile number into the instruction text,
  // so each one needs a literal: the switches fold at compile time.
  template <int N>
  static void Zero() {
    switch (N) {
      case 0: _tile_zero(0); break;
      case 1: _tile_zero(1); break;
      case 2: _tile_zero(2); break;
      case 3: _tile_zero(3); break;
      default: static_assert(N >= 0 && N < 4, "accumulators are tiles 0-3");
    }
  }
  template <int N>
  static void Load(const void* p, size_t stride) {
    // The asm of _tile_loadd does not tell the compiler it reads memory:
    // make the stores that filled p happen first.
    __asm__ volatile("" ::: "memory");
    switch (N) {
      case 0: _tile_loadd(0, p, stride); break;
      case 1: _tile_loadd(1, p, stride); break;
      case 2: _tile_loadd(2, p, stride); break;
      case 3: _tile_loadd(3, p, stride); break;
      case 4: _tile_loadd(4, p, stride); break;
      case 5: _tile_loadd(5, p, stride); break;
      case 6: _tile_loadd(6, p, stride); break;
      case 7: _tile_loadd(7, p, stride); break;
      default: break;
    }
  }
  template <int N>
  static void Store(void* p, size_t stride) {
    switch (N) {
      case 0: _tile_stored(0, p, stride); break;
      case 1: _tile_stored(1, p, stride); break;
      case 2: _tile_stored(2, p, stride); break;
      case 3: _tile_stored(3, p, stride); break;
      default: static_assert(N >= 0 && N < 4, "results are tiles 0-3");
    }
  }
#define HEADSUM_DP_B(C, A)                        \
  if (B == 6) _tile_dpbf16ps(C, A, 6);            \
  else _tile_dpbf16ps(C, A, 7);
#define HEADSUM_DP_AB(C)      \
  if (A == 4) {               \
    HEADSUM_DP_B(C, 4)        \
  } else {                    \
    HEADSUM_DP_B(C, 5)        \
  }
  // C (0-3) += A (4-5) B (6-7).
  template <int C, int A, int B>
  static void Dp() {
    static_assert(C >= 0 && C < 4 && (A == 4 || A == 5) && (B == 6 || B == 7), "tile roles");
    switch (C) {
      case 0: HEADSUM_DP_AB(0) break;
      case 1: HEADSUM_DP_AB(1) break;
      case 2: HEADSUM_DP_AB(2) break;
      default: HEADSUM_DP_AB(3) break;
    }
  }
#undef HEADSUM_DP_AB
#undef HEADSUM_DP_B
};

// Software tiles: eight 16 x 64-byte arrays per thread.
struct EmuTiles {
  struct State {
    alignas(64) uint8_t t[8][16][64];
    bool configured = false;
  };
  static State& S() {
    static thread_local State state;
    return state;
  }
  static void Configure() {
    memset(S().t, 0, sizeof(S().t));  // LDTILECFG zeroes the tiles
    S().configured = true;
  }
  static void Release() { S().configured = false; }
  template <int N>
  static void Zero() { memset(S().t[N], 0, sizeof(S().t[N])); }
  template <int N>
  static void Load(const void* p, size_t stride) {
    for (int r = 0; r < 16; ++r) memcpy(S().t[N][r], static_cast<const char*>(p) + r * stride, 64);
  }
  template <int N>
  static void Store(void* p, size_t stride) {
    for (int r = 0; r < 16; ++r) memcpy(static_cast<char*>(p) + r * stride, S().t[N][r], 64);
  }
  // TDPBF16PS: for each row m, pair k, column n:
  //   C[m][n] += A[m][2k] B[k][2n]; C[m][n] += A[m][2k+1] B[k][2n+1]
  template <int C, int A, int B>
  static void Dp() {
    State& s = S();
    for (int m = 0; m < 16; ++m) {
      float c[16];
      memcpy(c, s.t[C][m], 64);
      uint16_t a[32];
      memcpy(a, s.t[A][m], 64);
      for (int k = 0; k < 16; ++k) {
        uint16_t b[32];
        memcpy(b, s.t[B][k], 64);
        const float a0 = Bf16ToF32(a[2 * k]), a1 = Bf16ToF32(a[2 * k + 1]);
        for (int n = 0; n < 16; ++n) {
          c[n] = __builtin_fmaf(a0, Bf16ToF32(b[2 * n]), c[n]);
          c[n] = __builtin_fmaf(a1, Bf16ToF32(b[2 * n + 1]), c[n]);
        }
      }
      memcpy(s.t[C][m], c, 64);
    }
  }
};

// ---------------------------------------------------------------------------
// Attention.

// S[16][t0, t0 + 16 NT) of the group = Q K^T over all chunks of dims.
template <class T, int NT>
void ScoresTiles(const AttnScratch& s, size_t r0, size_t t0) {
  if (NT > 0) T::template Zero<0>();
  if (NT > 1) T::template Zero<1>();
  if (NT > 2) T::template Zero<2>();
  if (NT > 3) T::template Zero<3>();
  const size_t kt_stride = kKeyBlock * sizeof(uint32_t);
  for (size_t c = 0; c < s.Lp / 32; ++c) {
    T::template Load<4>(s.qp + r0 * s.Lp + 32 * c, s.Lp * sizeof(uint16_t));
    const uint32_t* kt = s.kt + 16 * c * kKeyBlock + t0;
    T::template Load<6>(kt, kt_stride);
    T::template Dp<0, 4, 6>();
    if (NT > 1) {
      T::template Load<7>(kt + 16, kt_stride);
      T::template Dp<(NT > 1 ? 1 : 0), 4, 7>();
    }
    if (NT > 2) {
      T::template Load<6>(kt + 32, kt_stride);
      T::template Dp<(NT > 2 ? 2 : 0), 4, 6>();
    }
    if (NT > 3) {
      T::template Load<7>(kt + 48, kt_stride);
      T::template Dp<(NT > 3 ? 3 : 0), 4, 7>();
    }
  }
  const size_t s_stride = kKeyBlock * sizeof(float);
  T::template Store<0>(s.s + t0, s_stride);
  if (NT > 1) T::template Store<(NT > 1 ? 1 : 0)>(s.s + t0 + 16, s_stride);
  if (NT > 2) T::template Store<(NT > 2 ? 2 : 0)>(s.s + t0 + 32, s_stride);
  if (NT > 3) T::template Store<(NT > 3 ? 3 : 0)>(s.s + t0 + 48, s_stride);
}

// tile[16][16 (n0 .. n0 + NT)] = P V over the block's key chunks.
template <class T, int NT>
void PvTiles(const AttnScratch& s, size_t n0, size_t nj) {
  if (NT > 0) T::template Zero<0>();
  if (NT > 1) T::template Zero<1>();
  if (NT > 2) T::template Zero<2>();
  if (NT > 3) T::template Zero<3>();
  const size_t vp_stride = 2 * s.Lv * sizeof(uint16_t);
  for (size_t kc = 0; kc < (nj + 31) / 32; ++kc) {
    T::template Load<4>(s.p + 32 * kc, kKeyBlock * sizeof(uint16_t));
    const uint16_t* vp = s.vp + 16 * kc * 2 * s.Lv + 32 * n0;
    T::template Load<6>(vp, vp_stride);
    T::template Dp<0, 4, 6>();
    if (NT > 1) {
      T::template Load<7>(vp + 32, vp_stride);
      T::template Dp<(NT > 1 ? 1 : 0), 4, 7>();
    }
    if (NT > 2) {
      T::template Load<6>(vp + 64, vp_stride);
      T::template Dp<(NT > 2 ? 2 : 0), 4, 6>();
    }
    if (NT > 3) {
      T::template Load<7>(vp + 96, vp_stride);
      T::template Dp<(NT > 3 ? 3 : 0), 4, 7>();
    }
  }
  const size_t stride = s.Lv * sizeof(float);
  float* out = s.tile + 16 * n0;
  T::template Store<0>(out, stride);
  if (NT > 1) T::template Store<(NT > 1 ? 1 : 0)>(out + 16, stride);
  if (NT > 2) T::template Store<(NT > 2 ? 2 : 0)>(out + 32, stride);
  if (NT > 3) T::template Store<(NT > 3 ? 3 : 0)>(out + 48, stride);
}

// One group of 16 query rows (rows past the item's last are zero Q, see no
// key and are never stored) over one key block.
template <class T>
void AmxGroupBlock(const AttnDims& a, const AttnScratch& s, size_t i0, size_t r0, size_t rows,
                   size_t j0, size_t nj, float scale2, bool v_nonfinite) {
  size_t keys[16] = {};
  BlockKeys(a, i0 + r0, rows, j0, nj, keys);
  size_t any = 0;
  for (size_t r = 0; r < rows; ++r) any |= keys[r];
  if (any == 0) return;
  size_t t0 = 0;
  for (; t0 + 64 <= nj; t0 += 64) ScoresTiles<T, 4>(s, r0, t0);
  switch ((nj - t0 + 15) / 16) {  // 1 to 4 tiles of keys are left
    case 4: ScoresTiles<T, 4>(s, r0, t0); break;
    case 3: ScoresTiles<T, 3>(s, r0, t0); break;
    case 2: ScoresTiles<T, 2>(s, r0, t0); break;
    case 1: ScoresTiles<T, 1>(s, r0, t0); break;
    default: break;
  }
  size_t redo[16], n_redo;
  const float* final_s =
      GroupSoftmax(a, s, i0 + r0, r0, 16, j0, nj, keys, scale2, v_nonfinite, redo, &n_redo);
  const size_t col_tiles = s.Lv / 16;
  size_t n0 = 0;
  for (; n0 + 4 <= col_tiles; n0 += 4) PvTiles<T, 4>(s, n0, nj);
  switch (col_tiles - n0) {
    case 3: PvTiles<T, 3>(s, n0, nj); break;
    case 2: PvTiles<T, 2>(s, n0, nj); break;
    case 1: PvTiles<T, 1>(s, n0, nj); break;
    default: break;
  }
  // acc = corr acc + P V
  for (size_t r = 0; r < 16; ++r) {
    float* acc_r = s.acc + (r0 + r) * s.Lv;
    const float* pv_r = s.tile + r * s.Lv;
    const __m512 c = _mm512_set1_ps(s.corr[r0 + r]);
    for (size_t n = 0; n < s.Lv; n += 16) {
      _mm512_storeu_ps(acc_r + n,
                       _mm512_fmadd_ps(_mm512_loadu_ps(acc_r + n), c, _mm512_loadu_ps(pv_r + n)));
    }
  }
  RedoRows(n_redo, redo, s.p, s.vp, s.Lv, a.head_dim, keys, s.corr + r0, s.saved,
           s.acc + r0 * s.Lv, final_s);
}

constexpr size_t kMinTileRows = kAmxMinTileRows;

template <class T>
void AmxAttentionRows(const AttnDims& a, const AttnViews& v, size_t b, size_t h, size_t i0,
                      size_t i1, size_t key_begin, size_t key_end, float* partial,
                      float* scratch) {
  const size_t rows = i1 - i0;
  if (rows < kMinTileRows) {
    Avx512AttentionRows(a, v, b, h, i0, i1, key_begin, key_end, partial, scratch);
    return;
  }
  const AttnScratch s = CarveAttnScratch(a, scratch, b, h);
  const float scale2 = Base2Scale(a);
  T::Configure();
  AttentionItem(a, v, b, h, i0, i1, key_begin, key_end, partial, s,
                [&](size_t j0, size_t nj, bool v_nonfinite) {
                  size_t r0 = 0;
                  for (; r0 + 16 <= rows; r0 += 16) {
                    AmxGroupBlock<T>(a, s, i0, r0, 16, j0, nj, scale2, v_nonfinite);
                  }
                  if (rows - r0 >= kMinTileRows) {
                    AmxGroupBlock<T>(a, s, i0, r0, rows - r0, j0, nj, scale2, v_nonfinite);
                  } else if (r0 < rows) {
                    Avx512Rows(a, s, i0, r0, rows, j0, nj, scale2, v_nonfinite);
                  }
                });
  T::Release();
}

// ---------------------------------------------------------------------------
// Projection: 32 rows x one panel (32 columns) per step, 2 x 2 C tiles,
// the heads and their dims all summed in the accumulators.

template <class T>
void AmxProjectRows(const ProjDims& p, const TensorView& heads, const uint16_t* packed_wo,
                    const float* bias, const TensorView& y, size_t b, size_t s0, size_t s1,
                    size_t panel0, size_t panel1, float* scratch) {
  const size_t Kp = InnerPadded(p), rows = s1 - s0;
  if (rows < kMinTileRows) {
    Avx512ProjectRows(p, heads, packed_wo, bias, y, b, s0, s1, panel0, panel1, scratch);
    return;
  }
  uint16_t* op = reinterpret_cast<uint16_t*>(scratch);
  float* tile = scratch + kProjRows * Kp / 2;
  float* row = tile + 32 * kPanelCols;
  PackHeadRows(p, heads, b, s0, rows, op);
  T::Configure();
  const size_t a_stride = Kp * sizeof(uint16_t), b_stride = kPanelCols * sizeof(uint16_t) * 2;
  const size_t c_stride = kPanelCols * sizeof(float);
  for (size_t panel = panel0; panel < panel1; ++panel) {
    const uint16_t* w = packed_wo + panel * Kp * kPanelCols;
    const size_t c0 = panel * kPanelCols, n = MinSize(kPanelCols, p.model_dim - c0);
    for (size_t r = 0; r < rows; r += 32) {
      const uint16_t* o = op + r * Kp;
      const bool two = rows - r > 16;  // a second row tile
      T::template Zero<0>();
      T::template Zero<1>();
      if (two) {
        T::template Zero<2>();
        T::template Zero<3>();
      }
      for (size_t k0 = 0; k0 < Kp; k0 += 32) {
        T::template Load<4>(o + k0, a_stride);
        const uint16_t* wk = w + (k0 / 2) * 2 * kPanelCols;
        T::template Load<6>(wk, b_stride);
        T::template Load<7>(wk + 32, b_stride);
        T::template Dp<0, 4, 6>();
        T::template Dp<1, 4, 7>();
        if (two) {
          T::template Load<5>(o + 16 * Kp + k0, a_stride);
          T::template Dp<2, 5, 6>();
          T::template Dp<3, 5, 7>();
        }
      }
      T::template Store<0>(tile, c_stride);
      T::template Store<1>(tile + 16, c_stride);
      if (two) {
        T::template Store<2>(tile + 16 * kPanelCols, c_stride);
        T::template Store<3>(tile + 16 * kPanelCols + 16, c_stride);
      }
      StoreYRows(tile, kPanelCols, MinSize(32, rows - r), bias, c0, n, y, b, s0 + r, row);
    }
  }
  T::Release();
}

bool Runs() { return CpuHasAmxBf16(); }
bool EmulatedRuns() { return CpuHasAvx512Bf16(); }
size_t AttentionScratch(const AttnDims& a) { return AttnScratchFloats(a); }

}  // namespace

const Path* AmxBf16Path() {
  static const Path path = {"AMX_BF16", Runs, AttentionScratch, AmxAttentionRows<HwTiles>,
                            PackWoPanels, ProjScratchFloats, AmxProjectRows<HwTiles>,
                            /*takes_options=*/true};
  return &path;
}

const Path* AmxBf16EmulatedPath() {
  static const Path path = {"AMX_BF16(emulated tiles)", EmulatedRuns, AttentionScratch,
                            AmxAttentionRows<EmuTiles>, PackWoPanels, ProjScratchFloats,
                            AmxProjectRows<EmuTiles>, /*takes_options=*/true};
  return &path;
}

}  // namespace native
}  // namespace headsum
