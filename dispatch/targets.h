// Target selection: which Highway targets this build compiled, which one the
// kernels run on now, and where each lives in an HWY_EXPORT table.  The only
// place that knows which targets exist.
#ifndef HEADSUM_DISPATCH_TARGETS_H_
#define HEADSUM_DISPATCH_TARGETS_H_

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace headsum {
namespace native {
struct Path;
}  // namespace native
namespace dispatch {

// Highway target bits this build compiled, best first.
std::vector<int64_t> CompiledTargets();
// The target the kernels run on now: on first use the best one the CPU
// runs, or HEADSUM_TARGET from the environment when it names one.
int64_t ActiveTarget();
// Makes `target` the active one; false when not compiled or not runnable.
bool SetActiveTarget(int64_t target);
// Makes the best target the CPU runs the active one again.
void ResetActiveTarget();
// 0 when `name` is no compiled target.
int64_t TargetFromName(const char* name);
bool CpuRuns(int64_t target);
// Index of `target`'s entry in a table made by HWY_EXPORT.
size_t TableIndex(int64_t target);

// The CPU's vendor (x86 CPUID leaf 0; kOther elsewhere).
enum class CpuVendor { kIntel, kAmd, kOther };
CpuVendor Vendor();

// Native bf16 paths (kernels/native/native.h), targets beside Highway's: on
// first use the best one the CPU runs is in force (bf16 calls take it, every
// other call the active Highway target), unless HEADSUM_TARGET names another
// target.  nullptr: none in force.  (Which calls take it: NativeFor in
// dispatch/native_ops.h.)
const native::Path* ActiveNative();
// Puts `path` in force with the best Highway target; false when the CPU
// cannot run it.
bool SetActiveNative(const native::Path* path);
// The name headsum_active_target() reports: the native path in force, else
// the Highway target.
const char* ActiveTargetName();
// fpmath (headsum_fpmath): whether f32/f16 inputs may be rounded to bf16 for
// a native path.
int FpMath();
void SetFpMath(int mode);

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_TARGETS_H_
