// C++17 against the installed package through headsum.hpp.
#include <headsum/headsum.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  headsum::ProjShape s;
  s.batch = 1; s.seq = 3; s.heads = 2; s.head_dim = 2; s.model_dim = 3;
  std::vector<float> heads(s.head_elements(), 1.0f), wo(s.wo_elements(), 0.5f);
  std::vector<float> bias(3, 1.0f), y(s.y_elements());
  headsum::project_heads_sum(s, heads, wo, bias, y);
  // Each y = bias + sum over H*L = 4 products of 1 * 0.5 = 3.
  for (float v : y) {
    if (std::fabs(v - 3.0f) > 1e-6f) return 1;
  }
  try {
    s.heads = 0;
    headsum::project_heads_sum(s, heads, wo, bias, y);
    return 1;
  } catch (const headsum::Error& e) {
    std::printf("C++ consumer: ok on %s (%s)\n", headsum::active_target().c_str(), e.what());
  }
  return 0;
}
