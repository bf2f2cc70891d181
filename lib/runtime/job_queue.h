// The queue of asynchronous moves (offloads, prefetch hints, scheduled prefetches) that the
// mover threads run, with the bytes of prefetches in flight. Guarded by the runtime's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

#include "lib/policy/schedule.h"
#include "tiermem/tiermem.h"

namespace tiermem {

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
  std::optional<Job> Pop() {
    if (jobs_.empty()) return std::nullopt;
    Job job = jobs_.front();
    jobs_.pop_front();
    return job;
  }
  // A popped job is done (or a queued one cancelled).
  void Done(const Job& job) {
    prefetch_in_flight_ -= job.prefetch_bytes;
    --outstanding_;
  }
  // Removes the queued jobs for which `cancel(job)` says true, calling Done for each.
  template <typename F>
  uint64_t RemoveIf(F&& cancel) {
    uint64_t removed = 0;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (!cancel(*it)) {
        ++it;
        continue;
      }
      Done(*it);
      it = jobs_.erase(it);
      ++removed;
    }
    return removed;
  }
  bool empty() const { return jobs_.empty(); }
  // Jobs queued or running.
  uint64_t outstanding() const { return outstanding_; }
  uint64_t prefetch_in_flight() const { return prefetch_in_flight_; }

 private:
  std::deque<Job> jobs_;
  uint64_t outstanding_ = 0;
  uint64_t prefetch_in_flight_ = 0;  // bytes
};

}  // namespace tiermem
