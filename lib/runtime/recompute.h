// Recompute callbacks: a tensor with one may be dropped instead of written down when rebuilding
// it costs less than the round trip, and is rebuilt by its callback when next needed. Owns no
// state (the callbacks are the tensors'). Calls the core, Room for space, Moves to fill.
#pragma once

#include "lib/runtime/core.h"

namespace tiermem {

class Moves;
class Room;

class RecomputeCallbacks {
 public:
  RecomputeCallbacks(Core& core, Moves& moves, Room& room)
      : core_(core), moves_(moves), room_(room) {}
  RecomputeCallbacks(const RecomputeCallbacks&) = delete;
  RecomputeCallbacks& operator=(const RecomputeCallbacks&) = delete;

  // Whether evicting t's only copy in `tier` drops it for its recompute callback instead of
  // writing it down: the callback costs less than the round trip down and back up.
  bool DropsForRecompute(const Tensor& t, tm_tier tier) const;
  // Frees v's only copy in `tier`: the tensor is dropped. Counted as an eviction.
  void DropForRecompute(Tensor& v, tm_tier tier, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // MakeValid of a dropped tensor: calls its callback, without the lock, to fill `dst`. Only a
  // demand rebuilds; a prefetch is dropped.
  absl::Status Recompute(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                         DropReason* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Rebuilds a dropped, claimed tensor for a caller's copy: in DRAM (HBM when it exceeds the DRAM
  // tier). The caller holds the room token.
  absl::Status RebuildForCaller(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  // The bandwidth per direction, GB/s, of the link from `tier` to the tier below.
  double RecomputeGbps(tm_tier tier) const;

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  Moves& moves_;
  Room& room_;
};

}  // namespace tiermem
