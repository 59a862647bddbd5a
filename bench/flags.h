// Command-line helpers shared by the benchmark mains.
#ifndef HEADSUM_BENCH_FLAGS_H_
#define HEADSUM_BENCH_FLAGS_H_

#include <cstring>

namespace headsum {
namespace bench {

// Whether argv[1..argc) has an argument starting with `flag` (e.g.
// "--benchmark_repetitions", given as "--benchmark_repetitions=7"): the
// mains add their defaults only for the flags the user did not give.
inline bool HasFlag(int argc, char** argv, const char* flag) {
  const size_t len = std::strlen(flag);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, len) == 0) return true;
  }
  return false;
}

}  // namespace bench
}  // namespace headsum

#endif  // HEADSUM_BENCH_FLAGS_H_
