// The queue of asynchronous moves (offloads, prefetch hints, scheduled prefetches) that the
// mover threads run, with the bytes of prefetches in flight. Guarded by the runtime's lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "lib/policy/schedule.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// Asynchronous moves run on a few threads of their own.
inline constexpr int kMoverThreads = 4;

enum class JobKind { kOffload, kHint, kPrefetch };

struct Job {
  uint64_t handle;
  tm_tier tier;
  JobKind kind;
  uint64_t horizon = Schedule::kNever;  // kPrefetch: the position it serves
  uint64_t prefetch_bytes = 0;          // counted in prefetch_in_flight() until done
};

class JobQueue {
 public:
  void Push(const Job& job) {
    jobs_.push_back(job);
    ++outstanding_;
    prefetch_in_flight_ += job.prefetch_bytes;
  }
  // The next job to run, if one may run now: the oldest prefetch or hint whose tensor has no
  // offload queued before it, else the oldest offload while fewer than `max_offloads` run. A
  // prefetch serves a use that is coming; an offload nobody waits for only makes room, so the
  // backward's prefetches neither wait behind the forward's write-downs to NVMe in the queue,
  // nor for a mover thread that slow writes all hold. One tensor's jobs keep their order.
  std::optional<Job> Pop(uint32_t max_offloads) {
    auto pick = Next(max_offloads);
    if (pick == jobs_.end()) return std::nullopt;
    Job job = *pick;
    jobs_.erase(pick);
    if (job.kind == JobKind::kOffload) ++running_offloads_;
    return job;
  }
  // Whether Pop would return a job now.
  bool HasRunnable(uint32_t max_offloads) { return Next(max_offloads) != jobs_.end(); }
  // A popped job is done.
  void Done(const Job& job) {
    if (job.kind == JobKind::kOffload) --running_offloads_;
    Forget(job);
  }
  // Removes the queued jobs for which `cancel(job)` says true, each no longer counted.
  template <typename F>
  uint64_t RemoveIf(F&& cancel) {
    uint64_t removed = 0;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (!cancel(*it)) {
        ++it;
        continue;
      }
      Forget(*it);
      it = jobs_.erase(it);
      ++removed;
    }
    return removed;
  }
  bool empty() const { return jobs_.empty(); }
  // Offloads taken by Pop and not yet done.
  uint32_t running_offloads() const { return running_offloads_; }
  // Jobs queued or running.
  uint64_t outstanding() const { return outstanding_; }
  uint64_t prefetch_in_flight() const { return prefetch_in_flight_; }

 private:
  std::deque<Job>::iterator Next(uint32_t max_offloads) {
    auto pick = jobs_.end();
    offloads_passed_.clear();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->kind == JobKind::kOffload) {
        if (pick == jobs_.end() && running_offloads_ < max_offloads) pick = it;
        offloads_passed_.push_back(it->handle);
      } else if (std::find(offloads_passed_.begin(), offloads_passed_.end(), it->handle) ==
                 offloads_passed_.end()) {
        return it;
      }
    }
    return pick;
  }
  // A job leaves the counts: done, or cancelled while queued.
  void Forget(const Job& job) {
    prefetch_in_flight_ -= job.prefetch_bytes;
    --outstanding_;
  }

  std::deque<Job> jobs_;
  std::vector<uint64_t> offloads_passed_;  // Pop's scratch: tensors of the offloads it passed
  uint64_t outstanding_ = 0;
  uint32_t running_offloads_ = 0;
  uint64_t prefetch_in_flight_ = 0;  // bytes
};

}  // namespace tiermem
