// Scheduled prefetches up the link in the order of their uses. Copies running side by side share
// the link (the emulated device's lanes serve their jobs in turn, a GPU's copy engines interleave
// streams), so a prefetch needed soon finishes no sooner than one needed later that started with
// it: under a tight HBM budget the first missed its use while the second was early. Each large
// DRAM -> HBM prefetch is therefore enqueued after the one before it (its copy waits, on the
// device, for that copy's fence: no host wake-up between them), and among prefetches about to
// enqueue, the one serving the earliest use goes first. Demands and small copies (latency, not
// bandwidth, bound) are not ordered, and go before: a large copy up the link that a use waits
// for (a demand) is urgent, and the ordered prefetches enqueued while it runs start after it,
// rather than share the link with it (a demand sharing the link with a prefetch of a tensor used
// later took twice its time). Its own lock: the turns are taken without the runtime's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "io/copy_engine.h"
#include "io/sync.h"

namespace tiermem {

class LinkOrder {
 public:
  // Prefetches smaller than this run beside the others.
  static constexpr uint64_t kMinBytes = 1 << 20;

  // Blocks while a prefetch is enqueuing, an urgent copy is (UrgentComing), or a prefetch serving
  // an earlier position waits to; returns the fences the copy must start after: the ordered copy
  // before it and the urgent copies, those still in flight (none: nothing to wait for). Every
  // Enter is followed by one Leave.
  std::vector<io::FencePtr> Enter(uint64_t position) {
    MutexLock lock(&mu_);
    auto me = waiting_.insert(position);
    while (enqueuing_ || urgent_coming_ > 0 || *waiting_.begin() != position) turn_.Wait(&mu_);
    waiting_.erase(me);
    enqueuing_ = true;
    if (last_ != nullptr && last_->Passed()) last_ = nullptr;
    PruneUrgent();
    std::vector<io::FencePtr> after = urgent_;
    if (last_ != nullptr) after.push_back(last_);
    return after;
  }
  // A copy up the link that a use waits for is about to be enqueued: prefetches enter only once
  // Urgent has its fence, so that none enqueued after it misses that fence. Every UrgentComing
  // is followed by one Urgent.
  void UrgentComing() {
    MutexLock lock(&mu_);
    ++urgent_coming_;
  }
  // That copy, just enqueued (null: it could not be): ordered prefetches that enter from now on
  // start after it.
  void Urgent(io::FencePtr fence) {
    MutexLock lock(&mu_);
    PruneUrgent();
    if (fence != nullptr) urgent_.push_back(std::move(fence));
    if (urgent_coming_ > 0) --urgent_coming_;
    turn_.SignalAll();
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
  void PruneUrgent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::erase_if(urgent_, [](const io::FencePtr& f) { return f->Passed(); });
  }

  Mutex mu_;
  CondVar turn_;
  bool enqueuing_ ABSL_GUARDED_BY(mu_) = false;
  int urgent_coming_ ABSL_GUARDED_BY(mu_) = 0;  // urgent copies being enqueued
  std::multiset<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
  io::FencePtr last_ ABSL_GUARDED_BY(mu_);
  std::vector<io::FencePtr> urgent_ ABSL_GUARDED_BY(mu_);  // urgent copies, maybe passed
};

}  // namespace tiermem
