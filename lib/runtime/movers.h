// The mover threads that drain the queue of asynchronous moves (MoveJobs: prefetches and
// offloads), and offloads parked until a release frees room. Owns the parked offloads, the
// threads and the stop flag. Calls the core, the queue, Moves to run a job, Prefetcher to
// refill after one.
#pragma once

#include "lib/runtime/core.h"
#include "lib/runtime/move_jobs.h"

namespace tiermem {

class Moves;
class Prefetcher;

class Movers {
 public:
  Movers(Core& core, MoveJobs& jobs, Moves& moves, Prefetcher& prefetcher)
      : core_(core), jobs_(jobs), moves_(moves), prefetcher_(prefetcher) {}
  Movers(const Movers&) = delete;
  Movers& operator=(const Movers&) = delete;

  // Starts the mover threads (set-up).
  void Start(int threads);
  // Abandons the queued moves, lets the running ones finish and joins the threads.
  void Stop() ABSL_LOCKS_EXCLUDED(runtime_lock);
  // Queues an asynchronous move.
  absl::Status Enqueue(uint64_t handle, tm_tier tier, JobKind kind);
  // The tensor was destroyed: its parked offload goes, and the others may find its room.
  void Forget(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Waits until no move is queued or running, running the parked offloads on this thread
  // (SyncAll).
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Parked offloads: an asynchronous offload that found no room while callers held copies
  // waits for a release (or a destroy) to be queued again, rather than fail at once; a sync
  // runs it on the caller's thread, where no room is an error.
  // Queues again those parked for `freed` (all of them when nullopt: a destroy frees every tier);
  // nothing when none is parked.
  void RequeueParkedOffloads(std::optional<tm_tier> freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Runs t's parked offload, if any, on the caller's thread (a sync).
  void RunParkedOffload(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  // Runs one job on its claimed tensor; the failure to keep, if any.
  absl::Status RunJob(Tensor& t, const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  bool AnyPinned(tm_tier tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);  // a caller holds a copy
  // A mover thread: runs queued moves until the runtime stops.
  void MoverLoop();

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  MoveJobs& jobs_;
  Moves& moves_;
  Prefetcher& prefetcher_;
  // Offloads parked until a release, by handle, with their target tier (job_queue.cc).
  absl::flat_hash_map<uint64_t, tm_tier> parked_offloads_ ABSL_GUARDED_BY(runtime_lock);
  bool stopping_ ABSL_GUARDED_BY(runtime_lock) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tiermem
