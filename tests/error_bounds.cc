#include "error_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace headsum_test {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// The error (first order, without kSafety) that what a model adds puts on
// a visible score whose scale q.k has magnitude s.
double OptionsScoreError(const RefAttnDims& d, int64_t b, int64_t h, int64_t i, int64_t j,
                         double s) {
  double e = 0.0;
  // What a model adds (kernels/attention/common-inl.h), each in f32
  // on scores in base 2 (errors there are ln 2 < 1 times smaller in
  // the natural units here, so the bounds hold as written):
  if (d.softcap > 0.0) {
    // tanh(x) = (1 - e) / (1 + e), e = 2^(-2 log2(e) |x|), x = s / c
    // (x: two roundings, 2 eps |x| relative; through the exponent
    // of e, 4 eps |x| relative on e), e itself kExpRelErr relative;
    // d tanh / de = -2 / (1 + e)^2 turns a relative error r on e
    // into at most r / 2 on tanh; the subtraction, addition and
    // division 3 eps; c tanh and c log2(e) an eps each.  Times c:
    // c (kExpRelErr / 2 + 5 eps) + 4 eps |s|.  The error already on
    // s passes through tanh (slope <= 1).
    e += d.softcap * (kExpRelErr / 2 + 5 * kEps) + 4 * kEps * s;
    s = d.softcap * std::tanh(s / d.softcap);
  }
  if (d.slopes != nullptr) {
    // slope log2(e) rounded (eps |term|), j - p exact, one FMA
    // rounding (eps |new s|).
    const double term = std::fabs(double(d.slopes[h]) * double(j - d.position(i)));
    s += term;
    e += kEps * term + kEps * s;
  }
  if (d.bias != nullptr) {
    const double term = std::fabs(double((*d.bias)[d.s_at(b, h, i, j)]));
    if (std::isfinite(term)) {
      s += term;
      e += kEps * term + kEps * s;
    }
  }
  return e;
}

// A row's sink (d.sinks set): raises the row's max *m to the sink's logit
// when that is larger, and returns its weight exp(sink - m) (unnormalized,
// the value it adds to the denominator) with *delta its relative error; 0
// (and *delta 0) without sinks.
double SinkWeight(const RefAttnDims& d, int64_t h, double* m, double* delta) {
  *delta = 0.0;
  if (d.sinks == nullptr) return 0.0;
  const double sink = double(d.sinks[h]);
  *m = std::max(*m, sink);
  *delta = std::min(kExpRelErr + 3 * kEps * (std::fabs(sink) + std::fabs(*m)), 1.0);
  return std::exp(sink - *m);
}

// First-order bound (without kSafety) on the error of each f32 score:
// (L + 3) eps |scale| sum_l |q_l k_l|; 0 where masked.
std::vector<double> QkScoresError(const RefAttnDims& d, const float* q, const float* k) {
  std::vector<double> err(d.scores_elems(), 0.0);
  const double per_unit = double(d.head_dim + 3) * kEps * std::fabs(d.scale);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = d.kv_head_of(h);
      for (int64_t i = 0; i < d.seq_q; ++i) {
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          if (!d.visible(i, j)) continue;
          double abs_dot = 0.0, dot = 0.0;
          for (int64_t l = 0; l < d.head_dim; ++l) {
            const double prod = double(q[d.q_at(b, h, i, l)]) * double(k[d.kv_at(b, g, j, l)]);
            abs_dot += std::fabs(prod);
            dot += prod;
          }
          const double e =
              per_unit * abs_dot + OptionsScoreError(d, b, h, i, j, std::fabs(d.scale * dot));
          err[d.s_at(b, h, i, j)] = e;
        }
      }
    }
  }
  return err;
}

// The softmax(S) V bound.  For one query row, let J be the entries the mask
// lets through with s_j > -inf, m = max_J s_j, w_j = exp(s_j - m),
// p_j = w_j / sum_J w_j, and for one output column A = sum_j p_j |v_j|.
//
// 1. Weights.  The kernel's w~_j = w_j (1 + e_j) with |e_j| <= delta_j:
//      delta_j = kExpRelErr                 exp itself ("a few ulp")
//              + 2 eps (|s_j| + |m|)        forming the argument s_j - m (or
//                                           s_j log2e - m log2e for exp2): a
//                                           few roundings of size u (|s|+|m|)
//                                           in the exponent = that much
//                                           relative error in w_j
//              + score_err_j                attention only: an absolute error
//                                           on s_j is a relative one on w_j.
//    An error on m itself is common to every w_j and cancels in p_j.  Where
//    s_j - m < -80, w_j < 2e-35 may underflow or flush to 0: delta_j = 1.
//    Normalizing, p~_j = p_j (1 + e_j) / (1 + e_bar) with e_bar = sum p_j e_j,
//    so  |sum_j (p~_j - p_j) v_j| = |sum_j p_j (e_j - e_bar) v_j| / (1 + e_bar)
//                                <= sum_j p_j delta_j |v_j| + delta_bar A
//    to first order (delta_bar = sum_j p_j delta_j).  This holds whether the
//    numerator and denominator share the w~_j or evaluate them separately.
// 2. Sums.  Numerator and denominator are sums of <= Skv terms: gamma_Skv
//    relative each (on sum p_j |v_j| = A and on the O ~ A result); a
//    flash-style kernel rescales both accumulators once per KV tile by the
//    same factor (its error cancels in the ratio, its rounding adds <= u per
//    tile, <= Skv tiles); one final division (u).  Together
//    <= (1.5 Skv + 1) eps A  <=  (2 Skv + 4) eps A.
// So  |O~ - O| <= kSafety * (sum_j p_j delta_j |v_j| + delta_bar A + (2 Skv + 4) eps A).
// A row with nothing visible has A = 0: the bound is 0 and the result must be
// exactly 0, as the API promises.
std::vector<double> SoftmaxVBoundImpl(const RefAttnDims& d, const std::vector<double>& scores,
                                      const std::vector<double>& score_err, const float* v) {
  std::vector<double> bound(d.q_elems(), 0.0);
  std::vector<double> p(size_t(d.seq_kv)), delta(size_t(d.seq_kv));
  const double accumulation = double(2 * d.seq_kv + 4) * kEps;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = d.kv_head_of(h);
      for (int64_t i = 0; i < d.seq_q; ++i) {
        double m = kMinusInf;
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          if (d.visible(i, j)) m = std::max(m, scores[d.s_at(b, h, i, j)]);
        }
        if (m == kMinusInf) continue;  // nothing visible: exact zeros
        // A sink joins the denominator alone: its weight's error enters
        // delta_bar (step 1), its value is 0; the kernel's last step (its
        // rescaling and the sink's exponential: SinkFactor) adds 4 eps A.
        double sink_delta;
        const double sink_p = SinkWeight(d, h, &m, &sink_delta);
        double z = sink_p;
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          const double s = scores[d.s_at(b, h, i, j)];
          p[j] = 0.0;
          delta[j] = 0.0;
          if (!d.visible(i, j) || s == kMinusInf) continue;  // weight exactly 0
          p[j] = std::exp(s - m);
          z += p[j];
          double dj = kExpRelErr + 2 * kEps * (std::fabs(s) + std::fabs(m));
          if (!score_err.empty()) dj += score_err[d.s_at(b, h, i, j)];
          if (s - m < -80.0) dj = 1.0;
          delta[j] = std::min(dj, 1.0);
        }
        double delta_bar = sink_p / z * sink_delta;
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          p[j] /= z;
          delta_bar += p[j] * delta[j];
        }
        const double last_steps = d.sinks != nullptr ? 4 * kEps : 0.0;
        for (int64_t l = 0; l < d.head_dim; ++l) {
          double a = 0.0, weighted = 0.0;
          for (int64_t j = 0; j < d.seq_kv; ++j) {
            if (p[j] == 0.0) continue;
            const double abs_v = std::fabs(double(v[d.kv_at(b, g, j, l)]));
            a += p[j] * abs_v;
            weighted += p[j] * delta[j] * abs_v;
          }
          bound[d.q_at(b, h, i, l)] =
              kSafety * (weighted + delta_bar * a + (accumulation + last_steps) * a);
        }
      }
    }
  }
  return bound;
}

}  // namespace

std::vector<double> QkScoresBound(const RefAttnDims& d, const float* q, const float* k) {
  std::vector<double> bound = QkScoresError(d, q, k);
  for (double& x : bound) x *= kSafety;
  return bound;
}

std::vector<double> SoftmaxVBound(const RefAttnDims& d, const float* scores, const float* v) {
  std::vector<double> s(d.scores_elems());
  for (size_t n = 0; n < s.size(); ++n) s[n] = double(scores[n]);
  return SoftmaxVBoundImpl(d, s, /*score_err=*/{}, v);
}

std::vector<double> AttentionBound(const RefAttnDims& d, const float* q, const float* k,
                                   const float* v) {
  return SoftmaxVBoundImpl(d, RefQkScores(d, q, k), QkScoresError(d, q, k), v);
}

std::vector<double> NativeBf16PvBound(const RefAttnDims& d, const float* q, const float* k,
                                      const float* v) {
  std::vector<float> abs_v(size_t(d.batch * d.kv_heads * d.seq_kv * d.head_dim));
  for (size_t i = 0; i < abs_v.size(); ++i) abs_v[i] = std::fabs(v[i]);
  std::vector<double> a = RefProbsTimesV(d, RefSoftmaxRows(d, RefQkScores(d, q, k)), abs_v.data());
  for (double& x : a) x *= kSafety / 256.0;
  return a;
}

std::vector<double> AbsContributions(const RefProjDims& d, const float* heads, const float* wo) {
  std::vector<double> a(d.per_head_elems(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      for (int64_t h = 0; h < d.heads; ++h) {
        double* out = &a[d.bsh(b, s, h) * size_t(d.model_dim)];
        for (int64_t l = 0; l < d.head_dim; ++l) {
          const double o = std::fabs(double(heads[d.o_at(b, h, s, l)]));
          for (int64_t col = 0; col < d.model_dim; ++col) {
            out[col] += o * std::fabs(double(wo[d.wo_at(h, l, col)]));
          }
        }
      }
    }
  }
  return a;
}

std::vector<double> ContributionBound(const RefProjDims& d, const std::vector<double>& abs_c) {
  std::vector<double> bound(abs_c.size());
  const double per_unit = kSafety * double(d.head_dim + 2) * kEps;
  for (size_t n = 0; n < abs_c.size(); ++n) bound[n] = per_unit * abs_c[n];
  return bound;
}

std::vector<double> ProjectionBound(const RefProjDims& d, const std::vector<double>& abs_c,
                                    const float* gates, const float* bias) {
  std::vector<double> bound(d.y_elems(), 0.0);
  const double per_unit = kSafety * double(d.heads * d.head_dim + d.heads + 3) * kEps;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      for (int64_t col = 0; col < d.model_dim; ++col) {
        double magnitude = bias == nullptr ? 0.0 : std::fabs(double(bias[col]));
        for (int64_t h = 0; h < d.heads; ++h) {
          const double g = gates == nullptr ? 1.0 : std::fabs(double(gates[h]));
          magnitude += g * abs_c[d.bsh(b, s, h) * size_t(d.model_dim) + size_t(col)];
        }
        bound[size_t((b * d.seq + s) * d.model_dim + col)] = per_unit * magnitude;
      }
    }
  }
  return bound;
}

std::vector<double> AttributionBound(const RefProjDims& d, const float* heads, const float* wo,
                                     const float* directions, int64_t n_directions) {
  // abs_wdir[h][l][r] = sum_col |Wo[h][l][col] dir_r[col]|
  const size_t R = size_t(n_directions);
  std::vector<double> abs_wdir(size_t(d.inner()) * R, 0.0);
  for (int64_t h = 0; h < d.heads; ++h) {
    for (int64_t l = 0; l < d.head_dim; ++l) {
      for (size_t r = 0; r < R; ++r) {
        double sum = 0.0;
        for (int64_t col = 0; col < d.model_dim; ++col) {
          sum += std::fabs(double(wo[d.wo_at(h, l, col)]) *
                           double(directions[r * size_t(d.model_dim) + size_t(col)]));
        }
        abs_wdir[size_t(h * d.head_dim + l) * R + r] = sum;
      }
    }
  }
  const double per_unit = kSafety * double(d.model_dim + d.head_dim + 3) * kEps;
  std::vector<double> bound(size_t(d.batch * d.seq * d.heads) * R, 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      for (int64_t h = 0; h < d.heads; ++h) {
        for (size_t r = 0; r < R; ++r) {
          double magnitude = 0.0;
          for (int64_t l = 0; l < d.head_dim; ++l) {
            magnitude += std::fabs(double(heads[d.o_at(b, h, s, l)])) *
                         abs_wdir[size_t(h * d.head_dim + l) * R + r];
          }
          bound[d.bsh(b, s, h) * R + r] = per_unit * magnitude;
        }
      }
    }
  }
  return bound;
}

// n = ||c||, a = (sum_l |O_l W_l,col|)_col, so |c_col| <= a_col and n <= ||a||.
// Two ways a kernel may compute the norm:
//  - direct: c~ (error <= gamma_L a per column), then sqrt(sum_col c~^2):
//    | ||c~|| - n | <= gamma_L ||a|| + (gamma_D / 2 + u) n;
//  - Gram: n^2 = O^T (Wo[h] Wo[h]^T) O, error on n^2 <= gamma_{D+2L} ||a||^2,
//    since sum_lm |O_l||O_m| sum_col |W_l,col||W_m,col| = ||a||^2.
// Both give  |n~^2 - n^2| <= Dsq := (D + 2L + 4) eps ||a||^2, and then
//   |n~ - n| = |n~^2 - n^2| / (n~ + n) <= Dsq / n    and
//   |n~ - n| <= sqrt(|n~ - n| (n~ + n)) <= sqrt(Dsq),
// whichever is smaller (the second matters when cancellation makes n tiny),
// plus eps n for the final sqrt's rounding.
std::vector<double> ContributionNormsBound(const RefProjDims& d,
                                           const std::vector<double>& contributions,
                                           const std::vector<double>& abs_c) {
  const size_t rows = size_t(d.batch * d.seq * d.heads);
  const size_t D = size_t(d.model_dim);
  std::vector<double> bound(rows, 0.0);
  for (size_t row = 0; row < rows; ++row) {
    double n2 = 0.0, a2 = 0.0;
    for (size_t col = 0; col < D; ++col) {
      n2 += contributions[row * D + col] * contributions[row * D + col];
      a2 += abs_c[row * D + col] * abs_c[row * D + col];
    }
    const double n = std::sqrt(n2);
    const double dsq = double(d.model_dim + 2 * d.head_dim + 4) * kEps * a2;
    const double via_sum = n > 0.0 ? dsq / n : std::numeric_limits<double>::infinity();
    bound[row] = kSafety * (std::min(via_sum, std::sqrt(dsq)) + kEps * n);
  }
  return bound;
}

// The layer's first-order error, step by step (u = eps / 2; every count below
// is of roundings, each taken as eps, as the bounds above do):
//
// 1. qkv = x W + b, the fused projection (one head of Dm, the bias as the
//    chain's start): as ProjectionBound with H = 1, L = Dm:
//      e = (Dm + 4) eps (sum_k |x_k W_kc| + |b_c|).
// 2. RoPE: x_lo' = x_lo c~ - x_hi s~ with c~, s~ the f32 table (u each), one
//    product and one (fused or not) multiply-add (<= 2 roundings):
//      e_lo' = |c| e_lo + |s| e_hi + 4 eps (|x_lo c| + |x_hi s|), e_hi' alike.
// 3. A 16-bit cache rounds the f32 K, V (error <= kSafety e) to nearest.
//    Rounding is monotone, so when round(x - kSafety e) == round(x + kSafety e)
//    the cache holds exactly round(x), the reference's value: no error.
//    Otherwise the cache may hold the neighbour:
//      e = round(x + kSafety e) - round(x - kSafety e)   (divided by kSafety,
//    as it is an actual distance, not a first-order term).
// 4. Attention: an absolute error on a score is a relative one on its weight,
//      score_err_j = scale sum_l (e_q,l |k_j,l| + |q_l| e_k,j,l)
//                  + (L + 3) eps scale sum_l |q_l k_j,l|          (qk_scores)
//    (+ OptionsScoreError for the softcap and ALiBi terms; the window masks
//    keys as causal does; a sink joins the denominator as SinkWeight says),
//    then softmax(S) V as SoftmaxVBound derives it (the weights' relative
//    errors delta_j, the (2 Skv + 4) eps of the sums), plus the error of V:
//      e_O,l = sum_j p_j delta_j |v_j,l| + delta_bar A_l + (2 Skv + 4) eps A_l
//            + sum_j p_j e_v,j,l,                A_l = sum_j p_j |v_j,l|.
// 5. y = sum_h O_h Wo[h] + bo: the error of O carried through Wo, plus the
//    projection's own (ProjectionBound):
//      e_y,c = sum_{h,l} e_O,h,l |Wo_hl,c| + (H L + H + 3) eps (sum |O Wo| + |bo_c|).
// The bound is kSafety e_y.
std::vector<double> LayerBound(const RefLayerSpec& spec, const float* x, int64_t B, int64_t T,
                               int64_t q0) {
  const int64_t L = spec.head_dim, H = spec.heads, Dm = spec.model_dim, N = spec.fused();
  const int64_t half = L / 2, rows = T - q0;
  // 1. Values (exact) and first-order errors of qkv.
  std::vector<double> val = RefLayerQkv(spec, x, B, T), err(val.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* x_t = x + (b * T + t) * Dm;
      for (int64_t row = 0; row < N; ++row) {
        const float *w, *bias;
        int64_t head, width;
        if (row < H) {
          w = spec.wq, bias = spec.bq, head = row, width = H * L;
        } else if (row < H + spec.kv_heads) {
          w = spec.wk, bias = spec.bk, head = row - H, width = spec.kv_heads * L;
        } else {
          w = spec.wv, bias = spec.bv, head = row - H - spec.kv_heads;
          width = spec.kv_heads * L;
        }
        for (int64_t l = 0; l < L; ++l) {
          const int64_t col = head * L + l;
          double magnitude = bias == nullptr ? 0.0 : std::fabs(double(bias[col]));
          for (int64_t k = 0; k < Dm; ++k) {
            magnitude += std::fabs(double(x_t[k]) * double(w[k * width + col]));
          }
          err[spec.qkv_at(b, T, t, row, l)] = double(Dm + 4) * kEps * magnitude;
        }
      }
    }
  }
  // 2. RoPE on Q and K.
  if (spec.rope_theta != 0.0) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t row = 0; row < H + spec.kv_heads; ++row) {
          for (int64_t i = 0; i < half; ++i) {
            double c, s;
            RefRopeAngle(spec, t, i, &c, &s);
            const size_t lo = spec.qkv_at(b, T, t, row, i), hi = lo + size_t(half);
            const double x_lo = val[lo], x_hi = val[hi], e_lo = err[lo], e_hi = err[hi];
            const double ac = std::fabs(c), as = std::fabs(s);
            val[lo] = x_lo * c - x_hi * s;
            val[hi] = x_hi * c + x_lo * s;
            err[lo] = ac * e_lo + as * e_hi + 4 * kEps * (std::fabs(x_lo) * ac + std::fabs(x_hi) * as);
            err[hi] = ac * e_hi + as * e_lo + 4 * kEps * (std::fabs(x_hi) * ac + std::fabs(x_lo) * as);
          }
        }
      }
    }
  }
  // 3. A 16-bit cache.
  if (spec.cache_dtype != HEADSUM_F32) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t row = H; row < N; ++row) {
          for (int64_t l = 0; l < L; ++l) {
            const size_t at = spec.qkv_at(b, T, t, row, l);
            const double reach = kSafety * err[at];
            const double up = RefRoundTo(spec.cache_dtype, val[at] + reach);
            const double down = RefRoundTo(spec.cache_dtype, val[at] - reach);
            err[at] = (up - down) / kSafety;
            val[at] = RefRoundTo(spec.cache_dtype, val[at]);
          }
        }
      }
    }
  }
  // 4. Attention: O's values and errors, [B][H][rows][L], over the keys
  // each query sees (the mask and window), its scores with the options'
  // terms and their errors (OptionsScoreError), a sink in the denominator
  // (SinkWeight and the last steps of SoftmaxVBoundImpl).
  const RefAttnDims d = RefLayerAttnDims(spec, B, T, q0);
  const double scale = d.scale;
  std::vector<double> o(size_t(B * H * rows * L), 0.0), o_err(o.size(), 0.0);
  const size_t n_keys = static_cast<size_t>(T);
  std::vector<double> score(n_keys), score_err(n_keys), p(n_keys), delta(n_keys);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t k_row = H + d.kv_head_of(h), v_row = k_row + spec.kv_heads;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = q0 + i;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          p[size_t(j)] = 0.0;
          if (!d.visible(i, j)) continue;
          double dot = 0.0, abs_dot = 0.0, propagated = 0.0;
          for (int64_t l = 0; l < L; ++l) {
            const size_t qa = spec.qkv_at(b, T, t, h, l), ka = spec.qkv_at(b, T, j, k_row, l);
            dot += val[qa] * val[ka];
            abs_dot += std::fabs(val[qa] * val[ka]);
            propagated += err[qa] * std::fabs(val[ka]) + std::fabs(val[qa]) * err[ka];
          }
          score[size_t(j)] = RefScoreWithOptions(d, b, h, i, j, scale * dot);
          score_err[size_t(j)] = scale * propagated + double(L + 3) * kEps * scale * abs_dot +
                                 OptionsScoreError(d, b, h, i, j, std::fabs(scale * dot));
          m = std::max(m, score[size_t(j)]);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: zeros
        double sink_delta;
        const double sink_p = SinkWeight(d, h, &m, &sink_delta);
        double z = sink_p;
        for (int64_t j = 0; j < T; ++j) {
          if (!d.visible(i, j)) continue;
          const double s = score[size_t(j)];
          p[size_t(j)] = std::exp(s - m);
          z += p[size_t(j)];
          double dj = kExpRelErr + 2 * kEps * (std::fabs(s) + std::fabs(m)) + score_err[size_t(j)];
          if (s - m < -80.0) dj = 1.0;
          delta[size_t(j)] = std::min(dj, 1.0);
        }
        double delta_bar = sink_p / z * sink_delta;
        for (int64_t j = 0; j < T; ++j) {
          p[size_t(j)] /= z;
          if (p[size_t(j)] != 0.0) delta_bar += p[size_t(j)] * delta[size_t(j)];
        }
        const double accumulation = double(2 * T + 4) * kEps + (d.sinks ? 4 * kEps : 0.0);
        for (int64_t l = 0; l < L; ++l) {
          double value = 0.0, a = 0.0, weighted = 0.0, v_err = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            if (p[size_t(j)] == 0.0) continue;
            const size_t va = spec.qkv_at(b, T, j, v_row, l);
            value += p[size_t(j)] * val[va];
            a += p[size_t(j)] * std::fabs(val[va]);
            weighted += p[size_t(j)] * delta[size_t(j)] * std::fabs(val[va]);
            v_err += p[size_t(j)] * err[va];
          }
          const size_t oa = size_t(((b * H + h) * rows + i) * L + l);
          o[oa] = value;
          o_err[oa] = weighted + delta_bar * a + accumulation * a + v_err;
        }
      }
    }
  }
  // 5. The output projection.
  std::vector<double> bound(size_t(B * rows * Dm));
  const double per_unit = double(H * L + H + 3) * kEps;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < Dm; ++c) {
        double carried = 0.0, magnitude = spec.bo == nullptr ? 0.0 : std::fabs(double(spec.bo[c]));
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t l = 0; l < L; ++l) {
            const size_t oa = size_t(((b * H + h) * rows + r) * L + l);
            const double w = std::fabs(double(spec.wo[(h * L + l) * Dm + c]));
            carried += o_err[oa] * w;
            magnitude += std::fabs(o[oa]) * w;
          }
        }
        bound[size_t((b * rows + r) * Dm + c)] = kSafety * (carried + per_unit * magnitude);
      }
    }
  }
  return bound;
}

}  // namespace headsum_test
