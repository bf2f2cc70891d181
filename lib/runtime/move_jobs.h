// The queue of asynchronous moves, with the signal that wakes the mover threads: what the
// Prefetcher queues (its prefetches, and the offloads a coming use supersedes, which it cancels)
// and what Movers queue and drain; Room cancels the prefetches a waiting demand's tier has queued.
// Owns the queue and the signal; calls the core only (to wait for work under the runtime's lock).
#pragma once

#include <optional>

#include "lib/runtime/core.h"

namespace tiermem {

class MoveJobs {
 public:
  explicit MoveJobs(Core& core) : core_(core) {}
  MoveJobs(const MoveJobs&) = delete;
  MoveJobs& operator=(const MoveJobs&) = delete;

  // Queues a move; Wake wakes one mover for what was queued (a mover that finds more work than
  // its own wakes another), WakeAll every one (a stop, offloads queued again).
  void Push(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { queue_.Push(job); }
  void Wake() { work_.Signal(); }
  void WakeAll() { work_.SignalAll(); }
  // A mover waits for a job (Wake, WakeAll), giving the runtime's lock back meanwhile.
  void WaitForWork() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { core_.Wait(work_); }
  // The next job that may run now (JobQueue::Pop), whether there is one, and one done.
  std::optional<Job> Pop(uint32_t max_offloads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return queue_.Pop(max_offloads);
  }
  bool HasRunnable(uint32_t max_offloads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return queue_.HasRunnable(max_offloads);
  }
  void Done(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { queue_.Done(job); }
  // Removes the queued (not running) jobs `cancel` says true for; how many.
  template <typename F>
  uint64_t RemoveIf(F&& cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return queue_.RemoveIf(std::forward<F>(cancel));
  }
  // Removes the tensor's queued (not running) offloads; how many.
  uint64_t CancelQueuedOffloads(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return queue_.RemoveIf(
        [handle](const Job& job) { return job.handle == handle && job.kind == JobKind::kOffload; });
  }
  // Removes the queued (not running) prefetches into `tier` (a demand waits for room: they
  // would only take it); how many.
  uint64_t CancelPrefetches(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    const uint64_t cancelled = queue_.RemoveIf([&](const Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (job.kind == JobKind::kOffload || job.tier != tier) return false;
      if (Tensor* t = core_.Lookup(job.handle); t != nullptr) --t->queued;
      return true;
    });
    core_.NotifyChanged();
    return cancelled;
  }
  // Jobs queued or running; bytes of prefetches queued or running.
  uint64_t outstanding() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return queue_.outstanding();
  }
  uint64_t PrefetchBytesInFlight() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return queue_.prefetch_in_flight();
  }

 private:
  Core& core_;
  CondVar work_;  // a job was queued, or the runtime stops
  JobQueue queue_ ABSL_GUARDED_BY(runtime_lock);
};

}  // namespace tiermem
