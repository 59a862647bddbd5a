#include "reference.h"

#include <algorithm>
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
          s[d.s_at(b, h, i, j)] = d.scale * dot;
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
        double sum = 0.0;
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

}  // namespace headsum_test
