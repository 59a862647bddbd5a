#include "dispatch/targets.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <mutex>

#include "headsum/headsum.h"
#include "hwy/highway.h"  // HWY_TARGETS under this build's target policy
#include "kernels/native/native.h"

namespace headsum {
namespace dispatch {
namespace {

// 0 until the first call resolves it.  Holds a Highway target bit, never a
// SIMD value: nothing here runs target-specific code at static init.
std::atomic<int64_t> g_active{0};
std::once_flag g_init;
// The native path in force (nullptr: none); set with g_active.
std::atomic<const native::Path*> g_native{nullptr};
std::atomic<int> g_fpmath{HEADSUM_FPMATH_STRICT};

const native::Path* BestNative() {
  for (const native::Path* const* p = native::CompiledPaths(); *p != nullptr; ++p) {
    if ((*p)->cpu_runs()) return *p;
  }
  return nullptr;
}

int64_t BestRunnable() {
  for (int64_t t : CompiledTargets()) {
    if (CpuRuns(t)) return t;
  }
  return HWY_STATIC_TARGET;  // unreachable: the fallback always runs
}

void InitFromEnvironment() {
  int64_t chosen = BestRunnable();
  const native::Path* chosen_native = BestNative();
  if (const char* env = getenv("HEADSUM_TARGET")) {
    const int64_t wanted = TargetFromName(env);
    const native::Path* wanted_native = native::PathByName(env);
    if (wanted != 0 && CpuRuns(wanted)) {
      chosen = wanted;
      chosen_native = nullptr;  // a Highway target turns the native paths off
    } else if (wanted_native != nullptr && wanted_native->cpu_runs()) {
      chosen_native = wanted_native;
    }
  }
  int64_t expected = 0;
  g_native.store(chosen_native, std::memory_order_relaxed);
  g_active.compare_exchange_strong(expected, chosen);
}

}  // namespace

CpuVendor Vendor() {
  static const CpuVendor vendor = [] {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return CpuVendor::kOther;
    char name[13];
    memcpy(name, &b, 4);
    memcpy(name + 4, &d, 4);
    memcpy(name + 8, &c, 4);
    name[12] = '\0';
    if (strcmp(name, "GenuineIntel") == 0) return CpuVendor::kIntel;
    if (strcmp(name, "AuthenticAMD") == 0) return CpuVendor::kAmd;
#endif
    return CpuVendor::kOther;
  }();
  return vendor;
}

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
  g_native.store(nullptr, std::memory_order_release);  // Highway alone
  g_active.store(target, std::memory_order_release);
  return true;
}

void ResetActiveTarget() {
  SetActiveTarget(BestRunnable());
  g_native.store(BestNative(), std::memory_order_release);
}

const native::Path* ActiveNative() {
  ActiveTarget();  // resolves the start-up choice first
  return g_native.load(std::memory_order_acquire);
}

bool SetActiveNative(const native::Path* path) {
  if (path == nullptr || !path->cpu_runs()) return false;
  std::call_once(g_init, [] {});
  g_active.store(BestRunnable(), std::memory_order_release);
  g_native.store(path, std::memory_order_release);
  return true;
}

const char* ActiveTargetName() {
  const int64_t t = ActiveTarget();
  if (const native::Path* n = g_native.load(std::memory_order_acquire)) return n->name;
  return hwy::TargetName(t);
}

int FpMath() { return g_fpmath.load(std::memory_order_relaxed); }
void SetFpMath(int mode) { g_fpmath.store(mode, std::memory_order_relaxed); }

size_t TableIndex(int64_t target) {
  // HWY_EXPORT tables: entry 0 is Highway's own first-call dispatcher, then
  // one entry per dynamic target in ChosenTarget bit order, the fallback last.
  if (target == HWY_SCALAR || target == HWY_EMU128) return HWY_MAX_DYNAMIC_TARGETS + 1;
  return hwy::Num0BitsBelowLS1Bit_Nonzero64(
      static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(target)));
}

}  // namespace dispatch
}  // namespace headsum
