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
  // The next job to run: the oldest prefetch or hint whose tensor has no offload queued before
  // it, else the oldest job. A prefetch serves a use that is coming; an offload nobody waits
  // for only makes room, so the backward's prefetches do not wait behind the forward's
  // write-downs to NVMe. One tensor's jobs keep their order.
  std::optional<Job> Pop() {
    if (jobs_.empty()) return std::nullopt;
    auto pick = jobs_.begin();
    offloads_passed_.clear();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->kind == JobKind::kOffload) {
        offloads_passed_.push_back(it->handle);
      } else if (std::find(offloads_passed_.begin(), offloads_passed_.end(), it->handle) ==
                 offloads_passed_.end()) {
        pick = it;
        break;
      }
    }
    Job job = *pick;
    jobs_.erase(pick);
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
  std::vector<uint64_t> offloads_passed_;  // Pop's scratch: tensors of the offloads it passed
  uint64_t outstanding_ = 0;
  uint64_t prefetch_in_flight_ = 0;  // bytes
};

}  // namespace tiermem
