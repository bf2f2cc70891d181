// Scheduled prefetches up the link in the order of their uses. Copies running side by side share
// the link (the emulated device's lanes serve their jobs in turn, a GPU's copy engines interleave
// streams), so a prefetch needed soon finishes no sooner than one needed later that started with
// it: under a tight HBM budget the first missed its use while the second was early. Each large
// DRAM -> HBM prefetch is therefore enqueued after the one before it (its copy waits, on the
// device, for that copy's fence: no host wake-up between them), and among prefetches about to
// enqueue, the one serving the earliest use goes first. Demands and small copies (latency, not
// bandwidth, bound) are not ordered. Its own lock: the turns are taken without the runtime's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>

#include "io/copy_engine.h"
#include "io/sync.h"

namespace tiermem {

class LinkOrder {
 public:
  // Prefetches smaller than this run beside the others.
  static constexpr uint64_t kMinBytes = 1 << 20;

  // Blocks while a prefetch is enqueuing, or one serving an earlier position waits to; returns
  // the fence the copy must start after (null when no ordered copy is still in flight). Every
  // Enter is followed by one Leave.
  io::FencePtr Enter(uint64_t position) {
    MutexLock lock(&mu_);
    auto me = waiting_.insert(position);
    while (enqueuing_ || *waiting_.begin() != position) turn_.Wait(&mu_);
    waiting_.erase(me);
    enqueuing_ = true;
    if (last_ != nullptr && last_->Passed()) last_ = nullptr;
    return last_;
  }
  // Prefetches waiting for their turn (for tests).
  size_t waiting() {
    MutexLock lock(&mu_);
    return waiting_.size();
  }
  // The copy is enqueued (`fence` passes when it is done) or could not be (null).
  void Leave(io::FencePtr fence) {
    MutexLock lock(&mu_);
    if (fence != nullptr) last_ = std::move(fence);
    enqueuing_ = false;
    turn_.SignalAll();
  }

 private:
  Mutex mu_;
  CondVar turn_;
  bool enqueuing_ ABSL_GUARDED_BY(mu_) = false;
  std::multiset<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
  io::FencePtr last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tiermem
