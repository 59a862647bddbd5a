#include "reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

namespace headsum_test {

namespace {
constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
}  // namespace

RefAttnDims::RefAttnDims(const headsum_attn_shape& s)
    : batch(s.batch),
      heads(s.heads),
      kv_heads(s.kv_heads == 0 ? s.heads : s.kv_heads),
      seq_q(s.seq_q),
      seq_kv(s.seq_kv),
      head_dim(s.head_dim),
      scale(s.scale == 0.0f ? 1.0 / std::sqrt(double(s.head_dim)) : double(s.scale)),
      causal(s.causal != 0) {}

double RefScoreWithOptions(const RefAttnDims& d, int64_t b, int64_t h, int64_t i, int64_t j,
                           double scaled) {
  double score = scaled;
  if (d.softcap > 0.0) score = d.softcap * std::tanh(score / d.softcap);
  if (d.slopes != nullptr) score += double(d.slopes[h]) * double(j - d.position(i));
  if (d.bias != nullptr) score += double((*d.bias)[d.s_at(b, h, i, j)]);
  return score;
}

// 'bhil,bgjl->bhij' with g = h / (H/Hkv), times scale; masked -> -inf.
std::vector<double> RefQkScores(const RefAttnDims& d, const float* q, const float* k) {
  std::vector<double> s(d.scores_elems());
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = d.kv_head_of(h);
      for (int64_t i = 0; i < d.seq_q; ++i) {
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          if (!d.visible(i, j)) {
            s[d.s_at(b, h, i, j)] = kMinusInf;
            continue;
          }
          double dot = 0.0;
          for (int64_t l = 0; l < d.head_dim; ++l) {
            dot += double(q[d.q_at(b, h, i, l)]) * double(k[d.kv_at(b, g, j, l)]);
          }
          s[d.s_at(b, h, i, j)] = RefScoreWithOptions(d, b, h, i, j, d.scale * dot);
        }
      }
    }
  }
  return s;
}

std::vector<double> RefSoftmaxRows(const RefAttnDims& d, const std::vector<double>& scores) {
  std::vector<double> p(d.scores_elems(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      for (int64_t i = 0; i < d.seq_q; ++i) {
        // Only causally visible, finite-weight (> -inf) entries take part.
        double row_max = kMinusInf;
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          if (d.visible(i, j)) row_max = std::max(row_max, scores[d.s_at(b, h, i, j)]);
        }
        if (row_max == kMinusInf) continue;  // nothing visible: zeros
        // A sink: one more logit in the denominator alone.
        double sum = 0.0;
        if (d.sinks != nullptr) {
          const double sink = double(d.sinks[h]);
          row_max = std::max(row_max, sink);
          sum = std::exp(sink - row_max);
        }
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          if (!d.visible(i, j)) continue;
          const double e = std::exp(scores[d.s_at(b, h, i, j)] - row_max);
          p[d.s_at(b, h, i, j)] = e;
          sum += e;
        }
        for (int64_t j = 0; j < d.seq_kv; ++j) p[d.s_at(b, h, i, j)] /= sum;
      }
    }
  }
  return p;
}

// 'bhij,bgjl->bhil'
std::vector<double> RefProbsTimesV(const RefAttnDims& d, const std::vector<double>& probs,
                                   const float* v) {
  std::vector<double> o(d.q_elems(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = d.kv_head_of(h);
      for (int64_t i = 0; i < d.seq_q; ++i) {
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          const double pj = probs[d.s_at(b, h, i, j)];
          if (pj == 0.0) continue;
          for (int64_t l = 0; l < d.head_dim; ++l) {
            o[d.q_at(b, h, i, l)] += pj * double(v[d.kv_at(b, g, j, l)]);
          }
        }
      }
    }
  }
  return o;
}

std::vector<double> RefSoftmaxV(const RefAttnDims& d, const float* scores, const float* v) {
  std::vector<double> s(d.scores_elems());
  for (size_t n = 0; n < s.size(); ++n) s[n] = double(scores[n]);
  return RefProbsTimesV(d, RefSoftmaxRows(d, s), v);
}

std::vector<double> RefAttention(const RefAttnDims& d, const float* q, const float* k,
                                 const float* v) {
  return RefProbsTimesV(d, RefSoftmaxRows(d, RefQkScores(d, q, k)), v);
}

RefProjDims::RefProjDims(const headsum_proj_shape& s)
    : batch(s.batch), seq(s.seq), heads(s.heads), head_dim(s.head_dim), model_dim(s.model_dim) {}

std::vector<double> RefConcatHeads(const RefProjDims& d, const float* heads) {
  std::vector<double> concat(size_t(d.batch * d.seq * d.inner()));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      for (int64_t h = 0; h < d.heads; ++h) {
        for (int64_t l = 0; l < d.head_dim; ++l) {
          concat[size_t((b * d.seq + s) * d.inner() + h * d.head_dim + l)] =
              double(heads[d.o_at(b, h, s, l)]);
        }
      }
    }
  }
  return concat;
}

std::vector<double> RefMatmul(const std::vector<double>& a, const float* b, int64_t m,
                              int64_t k, int64_t n) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[size_t(i * k + p)];
      for (int64_t j = 0; j < n; ++j) c[size_t(i * n + j)] += aip * double(b[size_t(p * n + j)]);
    }
  }
  return c;
}

std::vector<double> RefConcatProject(const RefProjDims& d, const float* heads,
                                     const float* wo, const float* bias) {
  std::vector<double> y =
      RefMatmul(RefConcatHeads(d, heads), wo, d.batch * d.seq, d.inner(), d.model_dim);
  if (bias != nullptr) {
    for (size_t row = 0; row < size_t(d.batch * d.seq); ++row) {
      for (int64_t c = 0; c < d.model_dim; ++c) y[row * size_t(d.model_dim) + c] += bias[c];
    }
  }
  return y;
}

// 'bhsl,hld->bshd'
std::vector<double> RefHeadContributions(const RefProjDims& d, const float* heads,
                                         const float* wo) {
  std::vector<double> c(d.per_head_elems(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      for (int64_t h = 0; h < d.heads; ++h) {
        double* out = &c[d.bsh(b, s, h) * size_t(d.model_dim)];
        for (int64_t l = 0; l < d.head_dim; ++l) {
          const double o = heads[d.o_at(b, h, s, l)];
          for (int64_t col = 0; col < d.model_dim; ++col) out[col] += o * wo[d.wo_at(h, l, col)];
        }
      }
    }
  }
  return c;
}

std::vector<double> RefGatedSum(const RefProjDims& d, const std::vector<double>& contributions,
                                const float* gates, const float* bias) {
  std::vector<double> y(d.y_elems(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      double* out = &y[size_t((b * d.seq + s) * d.model_dim)];
      for (int64_t h = 0; h < d.heads; ++h) {
        const double g = gates == nullptr ? 1.0 : double(gates[h]);
        const double* c = &contributions[d.bsh(b, s, h) * size_t(d.model_dim)];
        for (int64_t col = 0; col < d.model_dim; ++col) out[col] += g * c[col];
      }
      if (bias != nullptr) {
        for (int64_t col = 0; col < d.model_dim; ++col) out[col] += bias[col];
      }
    }
  }
  return y;
}

std::vector<double> RefAttribution(const RefProjDims& d,
                                   const std::vector<double>& contributions,
                                   const float* directions, int64_t n_directions) {
  const size_t rows = size_t(d.batch * d.seq * d.heads);
  std::vector<double> out(rows * size_t(n_directions), 0.0);
  for (size_t row = 0; row < rows; ++row) {
    const double* c = &contributions[row * size_t(d.model_dim)];
    for (int64_t r = 0; r < n_directions; ++r) {
      double dot = 0.0;
      for (int64_t col = 0; col < d.model_dim; ++col) {
        dot += c[col] * double(directions[size_t(r * d.model_dim + col)]);
      }
      out[row * size_t(n_directions) + size_t(r)] = dot;
    }
  }
  return out;
}

std::vector<double> RefContributionNorms(const RefProjDims& d,
                                         const std::vector<double>& contributions) {
  const size_t rows = size_t(d.batch * d.seq * d.heads);
  std::vector<double> out(rows, 0.0);
  for (size_t row = 0; row < rows; ++row) {
    double sum_sq = 0.0;
    for (int64_t col = 0; col < d.model_dim; ++col) {
      const double c = contributions[row * size_t(d.model_dim) + size_t(col)];
      sum_sq += c * c;
    }
    out[row] = std::sqrt(sum_sq);
  }
  return out;
}

// ---- The whole layer -----------------------------------------------------------

double RefRoundTo(headsum_dtype dtype, double x) {
  if (dtype == HEADSUM_F32) return double(float(x));
  if (x == 0.0 || !std::isfinite(x)) return x;
  // bits of significand, the smallest normal exponent, the largest finite.
  const int bits = dtype == HEADSUM_F16 ? 11 : 8;
  const int emin = dtype == HEADSUM_F16 ? -14 : -126;
  const double max_finite = dtype == HEADSUM_F16 ? 65504.0 : double(FLT_MAX);
  int e;
  std::frexp(x, &e);  // |x| = m 2^e, m in [0.5, 1): x's exponent is e - 1
  const int exponent = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, exponent - bits + 1);
  const double rounded = std::nearbyint(x / quantum) * quantum;  // ties to even
  if (std::fabs(rounded) > max_finite) {
    // Past the largest finite value by half a unit or more: infinity.
    return std::copysign(std::numeric_limits<double>::infinity(), x);
  }
  return rounded;
}

// 'btk,kc->btc' with W = [Wq Wk Wv] side by side, + [bq bk bv].
std::vector<double> RefLayerQkv(const RefLayerSpec& spec, const float* x, int64_t B, int64_t T) {
  const int64_t L = spec.head_dim, Dm = spec.model_dim;
  std::vector<double> qkv(size_t(B * T * spec.fused() * L));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* x_t = x + (b * T + t) * Dm;
      for (int64_t row = 0; row < spec.fused(); ++row) {
        // Which weight and bias, and the column of head `row` in it.
        const float *w, *bias;
        int64_t head, width;
        if (row < spec.heads) {
          w = spec.wq, bias = spec.bq, head = row, width = spec.heads * L;
        } else if (row < spec.heads + spec.kv_heads) {
          w = spec.wk, bias = spec.bk, head = row - spec.heads, width = spec.kv_heads * L;
        } else {
          w = spec.wv, bias = spec.bv, head = row - spec.heads - spec.kv_heads;
          width = spec.kv_heads * L;
        }
        for (int64_t l = 0; l < L; ++l) {
          const int64_t col = head * L + l;
          double sum = bias == nullptr ? 0.0 : double(bias[col]);
          for (int64_t k = 0; k < Dm; ++k) sum += double(x_t[k]) * double(w[k * width + col]);
          qkv[spec.qkv_at(b, T, t, row, l)] = sum;
        }
      }
    }
  }
  return qkv;
}

void RefRopeAngle(const RefLayerSpec& spec, int64_t t, int64_t i, double* c, double* s) {
  const double angle =
      double(t) / std::pow(spec.rope_theta, 2.0 * double(i) / double(spec.head_dim));
  *c = std::cos(angle);
  *s = std::sin(angle);
}

void RefRope(const RefLayerSpec& spec, int64_t B, int64_t T, std::vector<double>* qkv) {
  if (spec.rope_theta == 0.0) return;
  const int64_t half = spec.head_dim / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t row = 0; row < spec.heads + spec.kv_heads; ++row) {  // Q and K
        for (int64_t i = 0; i < half; ++i) {
          double c, s;
          RefRopeAngle(spec, t, i, &c, &s);
          double& lo = (*qkv)[spec.qkv_at(b, T, t, row, i)];
          double& hi = (*qkv)[spec.qkv_at(b, T, t, row, i + half)];
          const double x_lo = lo, x_hi = hi;
          lo = x_lo * c - x_hi * s;
          hi = x_hi * c + x_lo * s;
        }
      }
    }
  }
}

void RefRoundKv(const RefLayerSpec& spec, int64_t B, int64_t T, std::vector<double>* qkv) {
  if (spec.cache_dtype == HEADSUM_F32) return;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t row = spec.heads; row < spec.fused(); ++row) {
        for (int64_t l = 0; l < spec.head_dim; ++l) {
          double& x = (*qkv)[spec.qkv_at(b, T, t, row, l)];
          x = RefRoundTo(spec.cache_dtype, x);
        }
      }
    }
  }
}

RefAttnDims RefLayerAttnDims(const RefLayerSpec& spec, int64_t B, int64_t T, int64_t q0) {
  const headsum_attn_shape shape = {B,     spec.heads,      spec.kv_heads,        T - q0,
                                    T,     spec.head_dim,   0.0f,                 spec.causal ? 1 : 0};
  RefAttnDims d(shape);
  d.window = spec.window;
  d.softcap = spec.softcap;
  d.slopes = spec.slopes;
  d.sinks = spec.sinks;
  return d;
}

// 'bthl,bjgl->bhtj' (g = h / group) with the options, softmax over the
// visible j (RefSoftmaxRows), then 'bhtj,bjgl->bhtl'.
std::vector<double> RefLayerAttention(const RefLayerSpec& spec, const std::vector<double>& qkv,
                                      int64_t B, int64_t T, int64_t q0) {
  const RefAttnDims d = RefLayerAttnDims(spec, B, T, q0);
  const int64_t L = spec.head_dim, H = spec.heads, rows = T - q0;
  std::vector<double> scores(d.scores_elems(), kMinusInf);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t k_row = H + d.kv_head_of(h);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          if (!d.visible(i, j)) continue;
          double dot = 0.0;
          for (int64_t l = 0; l < L; ++l) {
            dot += qkv[spec.qkv_at(b, T, q0 + i, h, l)] * qkv[spec.qkv_at(b, T, j, k_row, l)];
          }
          scores[d.s_at(b, h, i, j)] = RefScoreWithOptions(d, b, h, i, j, d.scale * dot);
        }
      }
    }
  }
  const std::vector<double> p = RefSoftmaxRows(d, scores);
  std::vector<double> o(d.q_elems(), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t v_row = H + spec.kv_heads + d.kv_head_of(h);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          const double pj = p[d.s_at(b, h, i, j)];
          if (pj == 0.0) continue;
          for (int64_t l = 0; l < L; ++l) {
            o[d.q_at(b, h, i, l)] += pj * qkv[spec.qkv_at(b, T, j, v_row, l)];
          }
        }
      }
    }
  }
  return o;
}

// 'bhrl,hld->brd' written as the concat-then-GEMM it is.
std::vector<double> RefLayerOutput(const RefLayerSpec& spec, const std::vector<double>& o,
                                   int64_t B, int64_t rows) {
  const int64_t L = spec.head_dim, H = spec.heads, Dm = spec.model_dim;
  std::vector<double> y(size_t(B * rows * Dm));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < Dm; ++c) {
        double sum = spec.bo == nullptr ? 0.0 : double(spec.bo[c]);
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t l = 0; l < L; ++l) {
            sum += o[size_t(((b * H + h) * rows + r) * L + l)] *
                   double(spec.wo[(h * L + l) * Dm + c]);
          }
        }
        y[size_t((b * rows + r) * Dm + c)] = sum;
      }
    }
  }
  return y;
}

std::vector<double> RefLayerForward(const RefLayerSpec& spec, const float* x, int64_t B,
                                    int64_t T, int64_t q0) {
  std::vector<double> qkv = RefLayerQkv(spec, x, B, T);
  RefRope(spec, B, T, &qkv);
  RefRoundKv(spec, B, T, &qkv);
  return RefLayerOutput(spec, RefLayerAttention(spec, qkv, B, T, q0), B, T - q0);
}

}  // namespace headsum_test
