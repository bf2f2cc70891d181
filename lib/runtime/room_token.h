// The room token: demand operations that may allocate take it before claiming their tensor, so
// that at most one thread at a time makes room by evicting and waiting. A holder waits only for
// work that never waits for the token (moves in flight, host copies, prefetches), so waiting
// cannot deadlock. Re-entrant for the holder's own evictions. Guarded by the runtime's lock.
#pragma once

#include <cstdint>
#include <thread>

#include "io/sync.h"
#include "tiermem/tiermem.h"

namespace tiermem {

class RoomToken {
 public:
  // Waits (on `changed`, releasing `mu`) while another thread holds the token, then takes it.
  void Enter(Mutex& mu, CondVar& changed) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const std::thread::id me = std::this_thread::get_id();
    while (depth_ > 0 && owner_ != me) changed.Wait(&mu);
    if (depth_++ == 0) ++generation_;
    owner_ = me;
  }
  void Leave(CondVar& changed) {
    if (--depth_ == 0) {
      owner_ = std::thread::id{};
      changed.SignalAll();
    }
  }
  // Hands the token back early, whatever the depth, when this thread holds it.
  void Release(CondVar& changed) {
    if (!HeldByMe()) return;
    depth_ = 0;
    owner_ = std::thread::id{};
    changed.SignalAll();
  }
  bool HeldByMe() const { return depth_ > 0 && owner_ == std::this_thread::get_id(); }
  // Counts fresh takes of the token: a scope knows whether the token it took is still its own.
  uint64_t generation() const { return generation_; }

  // Demands making room in a tier now: prefetches into it are dropped meanwhile.
  uint32_t& wanted(tm_tier tier) { return wanted_[tier]; }

 private:
  std::thread::id owner_;
  int depth_ = 0;
  uint64_t generation_ = 0;
  uint32_t wanted_[TM_TIER_COUNT] = {0, 0, 0};
};

}  // namespace tiermem
