#include "test_util.h"

#include "../kernels/native/native.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <sstream>

namespace headsum_test {

std::vector<float> RandomUniform(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> out(n);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = double(state >> 40) * (1.0 / 16777216.0);  // 24 bits in [0, 1)
    out[i] = float(lo + (double(hi) - lo) * unit);
  }
  return out;
}

std::string Layout::Index(size_t flat) const {
  std::vector<int64_t> idx(extents.size());
  for (size_t a = extents.size(); a-- > 0;) {
    idx[a] = int64_t(flat % size_t(extents[a]));
    flat /= size_t(extents[a]);
  }
  std::string s;
  for (size_t a = 0; a < idx.size(); ++a) {
    s += "[";
    s += a < axes.size() ? axes[a] : '?';
    s += "=" + std::to_string(idx[a]) + "]";
  }
  return s;
}

size_t Layout::size() const {
  size_t n = 1;
  for (int64_t e : extents) n *= size_t(e);
  return n;
}

testing::AssertionResult AllWithinBound(const std::vector<double>& expected,
                                        const std::vector<double>& bound,
                                        const std::vector<float>& actual, const Layout& layout) {
  if (expected.size() != actual.size() || bound.size() != actual.size() ||
      layout.size() != actual.size()) {
    return testing::AssertionFailure()
           << "size mismatch: expected " << expected.size() << ", bound " << bound.size()
           << ", actual " << actual.size() << ", layout " << layout.size();
  }
  constexpr int kMaxReported = 8;
  size_t failures = 0;
  double worst_ratio = 0.0;
  std::ostringstream report;
  report.precision(9);
  for (size_t n = 0; n < actual.size(); ++n) {
    const double e = expected[n], a = double(actual[n]);
    bool ok;
    if (std::isinf(e)) {
      ok = (a == e);  // -inf (masked) must be exact
    } else {
      const double err = std::fabs(a - e);
      ok = err <= bound[n];  // false for NaN
      if (bound[n] > 0) worst_ratio = std::max(worst_ratio, err / bound[n]);
    }
    if (!ok) {
      if (failures < kMaxReported) {
        report << "\n  at " << layout.Index(n) << " (flat " << n << "): expected " << e
               << ", actual " << a << ", |diff| " << std::fabs(a - e) << ", bound " << bound[n];
      }
      ++failures;
    }
  }
  if (failures == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << failures << " of " << actual.size()
                                     << " elements outside the bound" << report.str()
                                     << (failures > kMaxReported ? "\n  ..." : "");
}

testing::AssertionResult BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b,
                                      const Layout& layout) {
  if (a.size() != b.size()) {
    return testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) {
    return testing::AssertionSuccess();
  }
  size_t differing = 0, first = 0;
  for (size_t n = 0; n < a.size(); ++n) {
    if (std::memcmp(&a[n], &b[n], sizeof(float)) != 0) {
      if (differing++ == 0) first = n;
    }
  }
  std::ostringstream s;
  s.precision(9);
  s << differing << " of " << a.size() << " elements differ bitwise; first at "
    << layout.Index(first) << ": " << a[first] << " vs " << b[first];
  return testing::AssertionFailure() << s.str();
}

Layout ScoresLayout(const MhaShape& s) {
  return {{s.batch, s.heads, s.seq_q, s.seq_kv}, "bhij"};
}
Layout HeadsLayout(const MhaShape& s) {
  return {{s.batch, s.heads, s.seq_q, s.head_dim}, "bhil"};
}
Layout YLayout(const MhaShape& s) { return {{s.batch, s.seq_q, s.model_dim}, "bsd"}; }
Layout PerHeadLayout(const MhaShape& s, int64_t last, char last_axis) {
  return {{s.batch, s.seq_q, s.heads, last}, std::string("bsh") + last_axis};
}

std::vector<std::string> CompiledTargetNames() {
  const int count = headsum_compiled_targets(nullptr, 0);
  std::vector<const char*> names(size_t(count > 0 ? count : 0));
  headsum_compiled_targets(names.data(), count);
  std::vector<std::string> out;
  for (const char* n : names) out.push_back(n == nullptr ? "null" : n);
  return out;
}

void TargetTest::SetUp() {
  const std::string& name = GetParam();
  const headsum_status status = headsum_set_target(name.c_str());
  if (status == HEADSUM_ERR_UNSUPPORTED) {
    GTEST_SKIP() << "target " << name << " is compiled but this CPU cannot run it";
  }
  ASSERT_EQ(status, HEADSUM_OK) << headsum_last_error();
  ASSERT_STREQ(headsum_active_target(), name.c_str());
}

void TargetTest::TearDown() { EXPECT_EQ(headsum_set_target(nullptr), HEADSUM_OK); }

std::string TargetParamName(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

bool NativeBf16Active() {
  return headsum::native::PathByName(headsum_active_target()) != nullptr;
}

bool OnednnAvailable() {
  const headsum_proj_shape shape = {1, 1, 1, 1, 1};
  const float heads = 1.0f, wo = 2.0f;
  float y = 0.0f;
  return headsum_concat_project_onednn(&shape, &heads, &wo, nullptr, &y) !=
         HEADSUM_ERR_UNSUPPORTED;
}

const char* StatusName(headsum_status status) {
  switch (status) {
    case HEADSUM_OK: return "HEADSUM_OK";
    case HEADSUM_ERR_INVALID_ARGUMENT: return "HEADSUM_ERR_INVALID_ARGUMENT";
    case HEADSUM_ERR_UNSUPPORTED: return "HEADSUM_ERR_UNSUPPORTED";
    case HEADSUM_ERR_OUT_OF_MEMORY: return "HEADSUM_ERR_OUT_OF_MEMORY";
    case HEADSUM_ERR_INTERNAL: return "HEADSUM_ERR_INTERNAL";
  }
  return "unknown status";
}

}  // namespace headsum_test
