// The library-level API: version, the compiled target list, forcing a target
// (and HEADSUM_TARGET), and headsum_last_error being per thread.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "headsum/headsum.h"
#include "test_util.h"

namespace headsum_test {
namespace {

TEST(Api, VersionIsMajorMinorPatch) {
  const char* v = headsum_version();
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(std::regex_match(v, std::regex(R"(\d+\.\d+\.\d+)"))) << "version \"" << v << "\"";
}

TEST(Api, CompiledTargetsAreAtLeastOneAndDistinct) {
  const int count = headsum_compiled_targets(nullptr, 0);
  ASSERT_GE(count, 1);
  std::vector<const char*> names(size_t(count), nullptr);
  EXPECT_EQ(headsum_compiled_targets(names.data(), count), count);
  std::set<std::string> distinct;
  for (const char* n : names) {
    ASSERT_NE(n, nullptr);
    EXPECT_STRNE(n, "");
    distinct.insert(n);
  }
  EXPECT_EQ(distinct.size(), size_t(count));
  std::string list;
  for (const char* n : names) list += std::string(n) + " ";
  std::printf("compiled targets (best first): %s\n", list.c_str());
}

TEST(Api, CompiledTargetsWritesOnlyCapacityEntriesButReturnsTheCount) {
  const int count = headsum_compiled_targets(nullptr, 0);
  ASSERT_GE(count, 1);
  const char* const kUntouched = "untouched";
  for (int capacity = 0; capacity < count; ++capacity) {
    std::vector<const char*> names(size_t(count) + 1, kUntouched);
    EXPECT_EQ(headsum_compiled_targets(names.data(), capacity), count) << capacity;
    for (int i = 0; i < capacity; ++i) EXPECT_NE(names[size_t(i)], kUntouched) << i;
    for (size_t i = size_t(capacity); i < names.size(); ++i) {
      EXPECT_EQ(names[i], kUntouched) << "entry " << i << " written with capacity " << capacity;
    }
  }
  // A larger capacity than needed writes exactly `count` entries.
  std::vector<const char*> names(size_t(count) + 3, kUntouched);
  EXPECT_EQ(headsum_compiled_targets(names.data(), count + 3), count);
  for (size_t i = size_t(count); i < names.size(); ++i) EXPECT_EQ(names[i], kUntouched) << i;
}

TEST(Api, CompiledTargetsWithNegativeCapacityWritesNothing) {
  const int count = headsum_compiled_targets(nullptr, 0);
  const char* const kUntouched = "untouched";
  std::vector<const char*> names(size_t(count), kUntouched);
  EXPECT_EQ(headsum_compiled_targets(names.data(), -1), count);
  for (const char* n : names) EXPECT_EQ(n, kUntouched);
}

TEST(Api, ActiveTargetIsACompiledOne) {
  const std::vector<std::string> compiled = CompiledTargetNames();
  const std::string active = headsum_active_target();
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), active), compiled.end())
      << "active target " << active << " is not in the compiled list";
}

// Each compiled target is either served (and then active) or refused with
// UNSUPPORTED; NULL goes back to the best target, which is the first
// compiled target the CPU can run.
TEST(Api, SetTargetForcesEachRunnableTargetAndNullRestoresTheBest) {
  ASSERT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
  const std::string best = headsum_active_target();
  std::string first_runnable;
  for (const std::string& name : CompiledTargetNames()) {
    const headsum_status st = headsum_set_target(name.c_str());
    if (st == HEADSUM_ERR_UNSUPPORTED) {
      std::printf("target %s: compiled, this CPU cannot run it (skipped)\n", name.c_str());
      continue;
    }
    ASSERT_EQ(st, HEADSUM_OK) << name << ": " << headsum_last_error();
    EXPECT_EQ(headsum_active_target(), name);
    if (first_runnable.empty()) first_runnable = name;
  }
  ASSERT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
  EXPECT_EQ(headsum_active_target(), best);
  EXPECT_EQ(best, first_runnable);
}

TEST(Api, UnknownTargetLeavesTheForcedTargetUnchanged) {
  const std::vector<std::string> compiled = CompiledTargetNames();
  const std::string lowest = compiled.back();
  if (headsum_set_target(lowest.c_str()) != HEADSUM_OK) GTEST_SKIP() << lowest << " not runnable";
  EXPECT_EQ(headsum_set_target("bogus"), HEADSUM_ERR_UNSUPPORTED);
  EXPECT_EQ(headsum_active_target(), lowest);
  EXPECT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
}

// Run in its own process by ctest with HEADSUM_TARGET set (see
// CMakeLists.txt): dispatch starts restricted to that target.
TEST(TargetEnvironment, HeadsumTargetRestrictsDispatchAtStartup) {
  const char* env = std::getenv("HEADSUM_TARGET");
  if (env == nullptr || *env == '\0') GTEST_SKIP() << "HEADSUM_TARGET is not set";
  const std::string at_startup = headsum_active_target();
  const std::vector<std::string> compiled = CompiledTargetNames();
  if (std::find(compiled.begin(), compiled.end(), env) == compiled.end()) {
    GTEST_SKIP() << "HEADSUM_TARGET=" << env << " is not compiled in this build";
  }
  if (headsum_set_target(env) == HEADSUM_ERR_UNSUPPORTED) {
    GTEST_SKIP() << "HEADSUM_TARGET=" << env << ": this CPU cannot run it";
  }
  EXPECT_EQ(at_startup, env);
  // An unknown name does not undo the restriction.
  EXPECT_EQ(headsum_set_target("bogus"), HEADSUM_ERR_UNSUPPORTED);
  EXPECT_EQ(headsum_active_target(), std::string(env));
}

// headsum_last_error is per thread: a failure on one thread is not seen on
// another, and does not overwrite the other's message.
TEST(Api, LastErrorIsThreadLocal) {
  std::string main_msg, fresh_thread_msg, other_msg, main_after;
  EXPECT_EQ(headsum_set_num_threads(-424242), HEADSUM_ERR_INVALID_ARGUMENT);
  main_msg = headsum_last_error();
  ASSERT_FALSE(main_msg.empty());

  std::thread other([&] {
    fresh_thread_msg = headsum_last_error();  // nothing failed on this thread yet
    const headsum_attn_shape shape = MhaShape{1, 1, 1, 1, 1, -313131, 1, false}.attn();
    const float x = 0;
    float out = 0;
    EXPECT_EQ(headsum_qk_scores(&shape, &x, &x, &out), HEADSUM_ERR_INVALID_ARGUMENT);
    other_msg = headsum_last_error();
  });
  other.join();
  main_after = headsum_last_error();

  EXPECT_EQ(fresh_thread_msg, "") << "a new thread sees another thread's error";
  EXPECT_FALSE(other_msg.empty());
  EXPECT_NE(other_msg, main_msg);
  EXPECT_EQ(main_after, main_msg) << "another thread's failure replaced this thread's message";
  EXPECT_NE(main_after.find("-424242"), std::string::npos) << main_after;
  EXPECT_NE(other_msg.find("-313131"), std::string::npos) << other_msg;
  EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
}

}  // namespace
}  // namespace headsum_test
