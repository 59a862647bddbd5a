// Per-element bounds on |f32 kernel result - exact result|, derived from
// float epsilon and the magnitudes of the inputs.  Each bound is
//
//     kSafety * (first-order rounding-error bound of the computation)
//
// where the first-order bound holds for ANY summation order (SIMD lanes,
// tree reductions, tiles, FMA or not) and kSafety = 2 absorbs second-order
// terms.  Notation: eps = FLT_EPSILON = 2^-23, u = eps/2 the unit roundoff.
//
// Dot products.  A float sum of n products, in any order, satisfies
//     |fl(sum_k a_k b_k) - sum_k a_k b_k| <= gamma_n * sum_k |a_k b_k|,
// gamma_n = n u / (1 - n u) ~ n eps / 2   (Higham, Accuracy and Stability
// of Numerical Algorithms, 3.1).  The bounds below use (n + c) * eps, i.e.
// already 2x gamma_n, with c counting the extra roundings (scale, bias, gate,
// final division...).  So the effective margin is ~4x the worst case, which
// random data never approaches, yet an off-by-one index or a dropped term
// (an O(1) relative error) is caught.
//
// Softmax.  See SoftmaxVBound in error_bounds.cc for the derivation.
#ifndef HEADSUM_TESTS_ERROR_BOUNDS_H_
#define HEADSUM_TESTS_ERROR_BOUNDS_H_

#include <cfloat>
#include <vector>

#include "reference.h"

namespace headsum_test {

constexpr double kEps = FLT_EPSILON;  // 2^-23
constexpr double kSafety = 2.0;
// Relative error of the kernels' f32 exp, "a few ulp" (Highway's Exp is
// documented at <= 1 ulp; 8 leaves room for a faster approximation).
constexpr double kExpRelErr = 8 * kEps;

// qk_scores: per score (0 where masked: -inf must be exact).
//   (L + 3) eps |scale| sum_l |q_l k_l|      (L products, scale, 1/sqrt(L) in f32)
std::vector<double> QkScoresBound(const RefAttnDims& d, const float* q, const float* k);

// softmax_v given f32 scores: per output element [B][H][Sq][L].
std::vector<double> SoftmaxVBound(const RefAttnDims& d, const float* scores, const float* v);

// attention (and softmax_v(qk_scores(...)) composed): as softmax_v, where each
// score additionally carries the qk_scores error.
std::vector<double> AttentionBound(const RefAttnDims& d, const float* q, const float* k,
                                   const float* v);

// The native bf16 paths (kernels/native/) round P to bf16 for P V: each
// term p_j v_j carries a relative error <= 2^-8 (bf16's unit roundoff), so
// an output element gains at most 2^-8 sum_j p_j |v_j|.  This returns
// kSafety 2^-8 sum_j p_j |v_j| per element [B][H][Sq][L], to add to
// AttentionBound when a native path computed the result.
std::vector<double> NativeBf16PvBound(const RefAttnDims& d, const float* q, const float* k,
                                      const float* v);

// Sum_l |O[b][h][s][l] Wo[h][l][col]|: the magnitude behind every bound of the
// projection family.  [B][S][H][D]
std::vector<double> AbsContributions(const RefProjDims& d, const float* heads, const float* wo);

// Per head contribution c[b][s][h][col] (per_head): L products.
//   (L + 2) eps sum_l |O_l W_l,col|
std::vector<double> ContributionBound(const RefProjDims& d, const std::vector<double>& abs_c);

// y = sum_h g_h c_h + bias: H*L products, H gate products, H + 1 additions.
//   (H L + H + 3) eps (sum_h |g_h| sum_l |O_l W_l,col| + |bias_col|)
// gates NULL means 1, bias NULL means 0.
std::vector<double> ProjectionBound(const RefProjDims& d, const std::vector<double>& abs_c,
                                    const float* gates, const float* bias);

// Attribution O_h . (Wo[h] dir_r) (or, equivalently, c_h . dir_r): a sum over
// l and col of O_l W_l,col dir_col, D then L accumulations (or L then D).
//   (D + L + 3) eps sum_l sum_col |O_l W_l,col dir_col|
std::vector<double> AttributionBound(const RefProjDims& d, const float* heads, const float* wo,
                                     const float* directions, int64_t n_directions);

// Norm ||c_h||: see ContributionNormsBound in error_bounds.cc.
std::vector<double> ContributionNormsBound(const RefProjDims& d,
                                           const std::vector<double>& contributions,
                                           const std::vector<double>& abs_c);

// The whole layer (headsum_mha_forward), per element of y for the tokens at
// positions q0..T-1 (as RefLayerForward).  See LayerBound in error_bounds.cc
// for the derivation: first-order errors carried through each step, kSafety
// applied once at the end.  [B][T - q0][Dm]
std::vector<double> LayerBound(const RefLayerSpec& spec, const float* x, int64_t B, int64_t T,
                               int64_t q0);

}  // namespace headsum_test

#endif  // HEADSUM_TESTS_ERROR_BOUNDS_H_
