// Prefetch along the schedule: the recorded step (Schedule), the position in it, the keys that
// name tensors across steps, and the prefetches queued ahead of the position. Owns the schedule
// (Room and WriteThrough read it through schedule() and tick() for do-no-harm), the keys and
// the prefetch limit. Calls the core and the queue of moves (MoveJobs: queues its prefetches,
// drops superseded offloads), which the mover threads drain.
#pragma once

#include "lib/runtime/core.h"
#include "lib/runtime/move_jobs.h"

namespace tiermem {

class Prefetcher {
 public:
  Prefetcher(Core& core, MoveJobs& jobs) : core_(core), jobs_(jobs) {}
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // What a refill of the window queued.
  struct Refill {
    bool whole = true;     // false: a use had to be left for a later look (its tensor not made
                           // yet, busy, or over the bytes in flight)
    uint64_t largest = 0;  // the largest tensor queued, bytes (0: none)
  };
  // Tensors up to this size have their window refilled every depth / 2 uses (NoteUse).
  static constexpr uint64_t kBatchedRefillBytes = 1ull << 20;
  // A prefetch into HBM of a tensor DRAM holds, of kBatchedRefillBytes or less: its copy is
  // only enqueued on the copy engine, so the caller's thread may start it itself
  // (Moves::StartPrefetch) rather than wake a mover for it.
  struct Start {
    uint64_t handle;
    uint64_t horizon;  // the position of the use it serves
  };
  // Queues prefetches for the scheduled uses ahead of the current position. With `starts`,
  // those that qualify (see Start) are appended there, counted but not queued: the caller
  // starts each, or queues it with Queue.
  Refill IssuePrefetches(std::vector<Start>* starts = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Queues a Start for a mover after all (the caller could not start it), and wakes one.
  void Queue(const Start& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Whether the schedule reads t within 2 x the prefetch depth (the uses IssuePrefetches sees)
  // and the tier of that read holds it until then beside everything used before it: then its
  // offload is superseded (dropped or skipped); otherwise the offload runs.
  bool UsedSoon(const Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Notes a use of t for the schedule and the LRU order, then prefetches ahead (the prefetches
  // the caller may start go to `starts`, when given: see IssuePrefetches).
  void NoteUse(Tensor& t, tm_tier tier, bool fill, std::vector<Start>* starts = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // A use for the LRU order only (Runtime::Acquire with scheduled == false).
  void NoteUnscheduledUse(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    t.last_use = ++tick_;
  }
  tm_tier HomeOf(tm_tensor_class cls) const;
  // The schedule key of a new tensor (see Schedule), which names it from now on (the newest
  // tensor of a key is the one the schedule's uses of that key name).
  uint64_t Register(const TensorDesc& desc, uint64_t handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // A destroyed tensor: its key no longer names it.
  void Forget(uint64_t key, uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The last pin of t's copy went: the schedule notes the release when t is its key's tensor.
  void NoteRelease(const Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The last pin of an orphaned tensor went (Forget ran when it was destroyed): the schedule
  // notes the release unless a newer tensor has taken its key meanwhile.
  void NoteOrphanRelease(const Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // A step begins (and its first tensors are prefetched), or ends; false: none had begun.
  void BeginStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  bool EndStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Replaces the learned schedule with a given one.
  void SetSchedule(std::vector<Schedule::Use> uses) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The schedule's length and relearn count.
  void FillStats(tm_stats& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Bytes of prefetches queued or running at most (set-up, once).
  void set_prefetch_limit(uint64_t bytes) { prefetch_limit_ = bytes; }
  // The live tensor that the schedule's `key` names now (the newest created), or nullptr.
  Tensor* FindKey(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The recorded step and the position in it, for Room's and WriteThrough's do-no-harm (which
  // copy is used again, and when); only the Prefetcher changes them.
  const Schedule& schedule() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return schedule_; }
  uint64_t tick() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return tick_; }

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  // Drops t's offloads still queued (not a running one): t is used within 2 x the depth.
  void CancelQueuedOffloads(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  MoveJobs& jobs_;
  Schedule schedule_ ABSL_GUARDED_BY(runtime_lock);
  uint64_t tick_ ABSL_GUARDED_BY(runtime_lock) = 0;
  absl::flat_hash_map<uint64_t, uint64_t> keyed_
      ABSL_GUARDED_BY(runtime_lock);                            // key -> newest handle
  uint64_t created_in_step_ ABSL_GUARDED_BY(runtime_lock) = 0;  // tensors created in this step
  uint32_t uses_to_refill_ ABSL_GUARDED_BY(runtime_lock) = 0;   // uses left before NoteUse refills
  uint64_t prefetch_limit_ = 0;                                 // bytes; set up once
};

}  // namespace tiermem
