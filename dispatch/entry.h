// What every public entry point does around its operation: check the
// arguments in order, stopping at the first failure (whose message names the
// argument), then run the operation with no exception crossing the C
// boundary.  An entry point is its signature and one chain:
//
//   AttnDims a;
//   return Entry("headsum_qk_scores")
//       .Check(CheckAttnShape, shape, &a)
//       .Pointers({{"q", q}, {"k", k}, {"scores", scores}})
//       .Run([&] { return QkScores(a, q, k, scores); });
#ifndef HEADSUM_DISPATCH_ENTRY_H_
#define HEADSUM_DISPATCH_ENTRY_H_

#include <exception>
#include <initializer_list>
#include <new>

#include "dispatch/validate.h"
#include "headsum/headsum.h"

// Returns from the enclosing function with the status of `expr` when it is
// a failure.
#define HEADSUM_CHECK(expr)                              \
  do {                                                   \
    if (headsum_status status_ = (expr)) return status_; \
  } while (0)

namespace headsum {
namespace dispatch {

// Kernels do not throw; this guards the C boundary all the same.
template <class F>
headsum_status Guarded(const char* fn, const F& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory");
  } catch (const std::exception& e) {
    return Fail(HEADSUM_ERR_INTERNAL, fn, "internal error: %s", e.what());
  }
}

// The status of an operation that reports no message of its own (the
// dispatch ops: a kernel can only run short of scratch or fail inside),
// reported under `fn`.
inline headsum_status Reported(const char* fn, headsum_status status) {
  if (status == HEADSUM_ERR_OUT_OF_MEMORY) {
    return Fail(status, fn, "out of memory for per-thread scratch");
  }
  if (status == HEADSUM_ERR_INTERNAL) return Fail(status, fn, "internal error");
  return status;
}

struct NamedPointer {
  const char* name;
  const void* pointer;
};

// One call of entry point `fn`: its checks, then its operation.  Once a
// check fails, the later checks and the operation do not run and the call
// returns that failure; nothing is written.
class Entry {
 public:
  explicit Entry(const char* fn) : fn_(fn) {}

  // check(fn, args...).  The arguments are bound by reference, so a
  // variable that an earlier check fills (the dims of a shape) is read when
  // this check runs; but an expression among them is evaluated before any
  // check runs, so one that needs an earlier check to have passed
  // (shape->batch, handle->heads) goes in a lambda or a helper:
  // Check([&](const char* fn) { return ...; }).
  template <class F, class... Args>
  Entry& Check(const F& check, const Args&... args) {
    if (status_ == HEADSUM_OK) status_ = check(fn_, args...);
    return *this;
  }
  // Not NULL: "<name> is NULL" otherwise.
  Entry& Pointer(const char* name, const void* pointer) {
    return Check(CheckPointer, name, pointer);
  }
  Entry& Pointers(std::initializer_list<NamedPointer> pointers) {
    for (const NamedPointer& p : pointers) Pointer(p.name, p.pointer);
    return *this;
  }

  // op(), a dispatch op whose failures carry no message (see Reported).
  template <class Op>
  headsum_status Run(const Op& op) const {
    if (status_ != HEADSUM_OK) return status_;
    return Guarded(fn_, [&] { return Reported(fn_, op()); });
  }
  // op(fn), which reports its own failures under fn.
  template <class Op>
  headsum_status RunReporting(const Op& op) const {
    if (status_ != HEADSUM_OK) return status_;
    return Guarded(fn_, [&] { return op(fn_); });
  }
  // The call is valid but cannot be served: `status` with "fn: why".
  headsum_status Refuse(headsum_status status, const char* why) const {
    if (status_ != HEADSUM_OK) return status_;
    return Fail(status, fn_, "%s", why);
  }

 private:
  const char* fn_;
  headsum_status status_ = HEADSUM_OK;
};

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_ENTRY_H_
