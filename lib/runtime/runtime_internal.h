// The runtime's scopes, shared by its source files: a tensor busy by this thread, work without
// the lock, the room token.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "lib/policy/eviction.h"
#include "lib/runtime/runtime.h"

namespace tiermem {

// Marks a tensor busy by this thread for a scope; the lock is held at both ends.
class BusyScope {
 public:
  BusyScope(Tensor& t, Core& core) : t_(t), core_(core) { t_.busy_by = std::this_thread::get_id(); }
  ~BusyScope() {
    t_.busy_by = std::thread::id{};
    core_.NotifyChanged();
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  Tensor& t_;
  Core& core_;
};

template <typename F>
absl::Status Core::Unlocked(Tensor& t, F&& f) {
  BusyScope busy(t, *this);
  Unlock();
  absl::Status s = f();
  Lock();
  return s;
}

// Holds the room token for a scope (or until Leave), taken for a request about `handle`: first
// it waits while another thread moves that tensor (WaitWhileMoving), without the token.
class RoomScope {
 public:
  RoomScope(Core& core, uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) : core_(core) {
    core_.WaitWhileMoving(handle);
    core_.EnterRoom();
    generation_ = core_.room_generation();
  }
  ~RoomScope() ABSL_NO_THREAD_SAFETY_ANALYSIS { Leave(); }
  // Hands the token back, unless a move already did (RoomToken::Release).
  void Leave() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (held_ && core_.RoomHeldByMe() && core_.room_generation() == generation_) {
      core_.LeaveRoom();
    }
    held_ = false;
  }
  RoomScope(const RoomScope&) = delete;
  RoomScope& operator=(const RoomScope&) = delete;

 private:
  Core& core_;
  bool held_ = true;
  uint64_t generation_ = 0;
};

// What eviction sees in a tier for one request.
struct Room::EvictionPlan {
  std::optional<EvictionWindow> window;
  std::vector<uint64_t> owners;   // the owner of each slot (0: free)
  std::vector<uint64_t> offsets;  // where each slot starts in the tier
  std::vector<EvictionSlot> slots;
  uint64_t free_bytes = 0;   // in holes, anywhere
  uint64_t reclaimable = 0;  // free bytes plus the evictable copies' bytes
  bool in_flight = false;    // a wall that will move: a copy another thread is moving
  // Pinned bytes by tensor, for the message of a demand that cannot fit.
  std::vector<std::pair<std::string, uint64_t>> pinned;
};

// The error of a prefetch (or hint) dropped for want of room: a hint, counted, never reported.
absl::Status DroppedPrefetch(const Tensor& t, tm_tier tier, DropReason reason,
                             absl::string_view message, DropReason* why);

}  // namespace tiermem
