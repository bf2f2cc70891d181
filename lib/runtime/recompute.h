// Recompute callbacks: a tensor with one may be dropped instead of written down when rebuilding
// it costs less than the round trip, and is rebuilt by its callback when next needed. Owns no
// state (the callbacks are the tensors'). Calls the core only: Room asks it whether to drop, and
// Moves rebuilds a dropped tensor through it (room made by Moves, filled by the callback here).
#pragma once

#include "lib/runtime/core.h"

namespace tiermem {

class RecomputeCallbacks {
 public:
  explicit RecomputeCallbacks(Core& core) : core_(core) {}
  RecomputeCallbacks(const RecomputeCallbacks&) = delete;
  RecomputeCallbacks& operator=(const RecomputeCallbacks&) = delete;

  // Whether evicting t's only copy in `tier` drops it for its recompute callback instead of
  // writing it down: the callback costs less than the round trip down and back up.
  bool DropsForRecompute(const Tensor& t, tm_tier tier) const;
  // Frees v's only copy in `tier`: the tensor is dropped. Counted as an eviction.
  void DropForRecompute(Tensor& v, tm_tier tier, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Why a dropped t cannot be rebuilt into `dst` for `want` (OkStatus: it can). Only a demand
  // rebuilds; a prefetch is dropped (`why`).
  absl::Status CheckRebuild(const Tensor& t, tm_tier dst, Want want, DropReason* why) const;
  // Fills the room `extent` made in `dst` for a dropped, busy t by calling its callback without
  // the lock (Moves::MakeValid of a dropped tensor); on failure the room is freed and t stays
  // dropped.
  absl::Status Fill(Tensor& t, tm_tier dst, const Extent& extent, const CallerStream& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Where a dropped tensor is rebuilt for a caller's copy: DRAM, HBM when it exceeds the DRAM
  // tier.
  tm_tier RebuildTier(const Tensor& t) const;

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  // The bandwidth per direction, GB/s, of the link from `tier` to the tier below.
  double RecomputeGbps(tm_tier tier) const;

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
};

}  // namespace tiermem
