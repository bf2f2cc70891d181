// Callers' copies: tm_tensor_write / read and copy_in / copy_out between a tensor and callers'
// memory (host or device, ordered on a stream). Owns the copies in flight until they are reaped
// (their failures reported by a sync or a step end). Calls the core, Moves to make a copy valid,
// Prefetcher to note the use, WriteThrough to count clean reads, RecomputeCallbacks to rebuild.
#pragma once

#include "lib/runtime/core.h"

namespace tiermem {

class Moves;
class Prefetcher;
class WriteThrough;
class RecomputeCallbacks;

class CallerCopies {
 public:
  CallerCopies(Core& core, Moves& moves, Prefetcher& prefetcher, WriteThrough& write_through,
               RecomputeCallbacks& recompute)
      : core_(core),
        moves_(moves),
        prefetcher_(prefetcher),
        write_through_(write_through),
        recompute_(recompute) {}
  CallerCopies(const CallerCopies&) = delete;
  CallerCopies& operator=(const CallerCopies&) = delete;

  // The one path of CopyIn, Write (into) and CopyOut, Read (out of the tensor).
  absl::Status CallerCopy(const char* fn, uint64_t handle, uint64_t offset, void* buffer,
                          uint64_t bytes, void* stream, bool into, bool wait,
                          bool stream_waits = true);
  // Records the failures of the callers' copies that are done (all of them when `wait`, only
  // those of `handle` unless it is 0). May release the lock to wait.
  void ReapCallerCopies(uint64_t handle, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // A fence on the caller's stream, or none without a stream.
  absl::StatusOr<io::FencePtr> StreamFence(void* stream, const char* function);
  // Whether every copy_out of the tensor listed in flight has passed.
  bool Passed(uint64_t handle) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Waits on the host for every copy in flight (the runtime goes: their memory with it).
  void WaitAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  struct CallerCopyRequest;
  // Zeros into the caller's buffer: the tensor was never written.
  absl::Status ReadZeros(Tensor& t, const CallerCopyRequest& r, CallerBuffer& buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  absl::Status CopyInto(const CallerCopyRequest& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  absl::Status CopyFrom(const CallerCopyRequest& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Rewrites a claimed tensor on NVMe with [offset, +bytes) from the caller's buffer, through
  // staging into a fresh extent that replaces the old one only once complete.
  absl::Status RewriteOnNvme(Tensor& t, const CallerCopyRequest& r, CallerBuffer& buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Enqueues (or, host to host with nothing to wait for, does) the copy between `addr` in
  // `tier` and the caller's buffer; with r.wait, returns once it is done.
  // With neither, a ticket of the copy in flight; refuses a buffer overlapping the copy.
  absl::StatusOr<std::optional<io::CopyTicket>> CopyTierAndCaller(
      Tensor& t, tm_tier tier, char* addr, const CallerCopyRequest& r, CallerBuffer& buffer,
      bool into_tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  Moves& moves_;
  Prefetcher& prefetcher_;
  WriteThrough& write_through_;
  RecomputeCallbacks& recompute_;
  // Copies between tensors and callers' memory (tm_tensor_copy_in / copy_out) not yet reaped:
  // their outcome is reported by tm_tensor_sync, tm_runtime_sync or tm_step_end.
  struct CopyInFlight {
    uint64_t handle;
    std::string tensor;
    const char* what;  // "copy_in" | "copy_out"
    io::CopyTicket ticket;
  };
  std::vector<CopyInFlight> in_flight_ ABSL_GUARDED_BY(runtime_lock);
};

}  // namespace tiermem
