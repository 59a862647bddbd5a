#include "dispatch/targets.h"

#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include "hwy/highway.h"  // HWY_TARGETS under this build's target policy

namespace headsum {
namespace dispatch {
namespace {

// 0 until the first call resolves it.  Holds a Highway target bit, never a
// SIMD value: nothing here runs target-specific code at static init.
std::atomic<int64_t> g_active{0};
std::once_flag g_init;

int64_t BestRunnable() {
  for (int64_t t : CompiledTargets()) {
    if (CpuRuns(t)) return t;
  }
  return HWY_STATIC_TARGET;  // unreachable: the fallback always runs
}

void InitFromEnvironment() {
  int64_t chosen = BestRunnable();
  if (const char* env = getenv("HEADSUM_TARGET")) {
    const int64_t wanted = TargetFromName(env);
    if (wanted != 0 && CpuRuns(wanted)) chosen = wanted;
  }
  int64_t expected = 0;
  g_active.compare_exchange_strong(expected, chosen);
}

}  // namespace

std::vector<int64_t> CompiledTargets() {
  std::vector<int64_t> targets;
  // Lower bits are better targets in Highway's numbering.
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    targets.push_back(rest & -rest);
  }
  return targets;
}

bool CpuRuns(int64_t target) {
  if (target == HWY_SCALAR || target == HWY_EMU128) return true;
  return (hwy::SupportedTargets() & target) != 0;
}

int64_t TargetFromName(const char* name) {
  if (name == nullptr) return 0;
  for (int64_t t : CompiledTargets()) {
    if (strcmp(hwy::TargetName(t), name) == 0) return t;
  }
  return 0;
}

int64_t ActiveTarget() {
  const int64_t t = g_active.load(std::memory_order_acquire);
  if (t != 0) return t;
  std::call_once(g_init, InitFromEnvironment);
  return g_active.load(std::memory_order_acquire);
}

bool SetActiveTarget(int64_t target) {
  if ((HWY_TARGETS & target) == 0 || !CpuRuns(target)) return false;
  std::call_once(g_init, [] {});  // an explicit choice outranks the environment
  g_active.store(target, std::memory_order_release);
  return true;
}

void ResetActiveTarget() { SetActiveTarget(BestRunnable()); }

size_t TableIndex(int64_t target) {
  // HWY_EXPORT tables: entry 0 is Highway's own first-call dispatcher, then
  // one entry per dynamic target in ChosenTarget bit order, the fallback last.
  if (target == HWY_SCALAR || target == HWY_EMU128) return HWY_MAX_DYNAMIC_TARGETS + 1;
  return hwy::Num0BitsBelowLS1Bit_Nonzero64(
      static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(target)));
}

}  // namespace dispatch
}  // namespace headsum
