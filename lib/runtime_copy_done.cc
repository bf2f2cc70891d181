// tm_tensor_copy_done: whether a tensor's copies to and from callers' memory have landed, asked
// without blocking, so that a caller whose stream does not wait for a copy
// (tm_tensor_copy_in_async) learns when its source may be reused.
#include <algorithm>

#include "lib/runtime.h"
#include "lib/runtime_internal.h"

namespace tiermem {

absl::StatusOr<bool> Runtime::CopyDone(uint64_t handle) {
  MutexLock lock(&mu_);
  // Find, not Claim: another thread's operation on the tensor is not waited for.
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  const Tensor& t = **found;
  // A copy_in (or a stream-ordered acquire) lands as the tensor's landing copy; copy_outs are
  // listed until reaped.
  if (t.landing.has_value() && !t.landing->fence->Passed()) return false;
  return std::none_of(caller_copies_.begin(), caller_copies_.end(),
                      [&](const CallerCopy& c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                        return c.handle == handle && !c.ticket.fence->Passed();
                      });
}

}  // namespace tiermem
