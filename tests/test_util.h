// Helpers shared by the tests: reproducible random data, bound checks that
// print where and by how much a result is off, and the per-target fixture.
#ifndef HEADSUM_TESTS_TEST_UTIL_H_
#define HEADSUM_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "headsum/headsum.h"
#include "shapes.h"

namespace headsum_test {

using headsum_shapes::MhaShape;

// Uniform in [lo, hi), the same on every platform (a fixed 64-bit LCG, not
// <random>'s implementation-defined distributions).
std::vector<float> RandomUniform(size_t n, float lo, float hi, uint64_t seed);

// Output buffers start filled with this, so a test can tell what a call wrote.
constexpr float kSentinel = 12345.0f;
inline std::vector<float> Sentinels(size_t n) { return std::vector<float>(n, kSentinel); }

// A row-major array's extents and one letter per axis ("bhij"), to print a
// flat index as [b=0][h=3][i=5][j=2].
struct Layout {
  std::vector<int64_t> extents;
  std::string axes;
  std::string Index(size_t flat) const;
  size_t size() const;
};

// |actual[n] - expected[n]| <= bound[n] for every n; an expected -inf must
// be exactly -inf.  On failure, lists the first few offenders (index,
// expected, actual, bound) and how many there were.
testing::AssertionResult AllWithinBound(const std::vector<double>& expected,
                                        const std::vector<double>& bound,
                                        const std::vector<float>& actual, const Layout& layout);

// Bitwise equality (memcmp), printing the first differing index.
testing::AssertionResult BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b,
                                      const Layout& layout);

// Layouts of each tensor.
Layout ScoresLayout(const MhaShape& s);  // [B][H][Sq][Skv]
Layout HeadsLayout(const MhaShape& s);   // [B][H][Sq][L]
Layout YLayout(const MhaShape& s);       // [B][S][D]
Layout PerHeadLayout(const MhaShape& s, int64_t last, char last_axis);  // [B][S][H][last]

// Runs `check` (returning an AssertionResult) on every shape, reporting
// each failure with the shape's name and stopping after kMaxFailingShapes
// failing shapes so one bug does not flood the log.
constexpr int kMaxFailingShapes = 5;
template <class Check>
void ForEachShape(const std::vector<MhaShape>& shapes, Check check) {
  int failing = 0;
  for (size_t n = 0; n < shapes.size(); ++n) {
    const testing::AssertionResult result = check(shapes[n], uint64_t(n));
    if (!result) {
      ADD_FAILURE() << "shape " << shapes[n].name() << ": " << result.message();
      if (++failing == kMaxFailingShapes) {
        ADD_FAILURE() << "stopping after " << failing << " failing shapes";
        return;
      }
    }
  }
}

// Names of the targets this build compiled, best first.
std::vector<std::string> CompiledTargetNames();

// Every kernel test runs once per compiled target: SetUp forces the target
// (skipping, with a message, when this CPU cannot run it) and checks it is
// active; TearDown restores the best one.
class TargetTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  void TearDown() override;
};

std::string TargetParamName(const testing::TestParamInfo<std::string>& info);

#define HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(Suite)                                    \
  INSTANTIATE_TEST_SUITE_P(Targets, Suite,                                                \
                           testing::ValuesIn(::headsum_test::CompiledTargetNames()),      \
                           ::headsum_test::TargetParamName)

// Whether the target in force is a native bf16 path (kernels/native/):
// then calls whose inputs are all bf16 round P to bf16 (NativeBf16PvBound).
bool NativeBf16Active();

// Whether this build has the oneDNN paths (they return UNSUPPORTED when not).
bool OnednnAvailable();

// "HEADSUM_OK", "HEADSUM_ERR_INVALID_ARGUMENT", ...
const char* StatusName(headsum_status status);

}  // namespace headsum_test

#endif  // HEADSUM_TESTS_TEST_UTIL_H_
