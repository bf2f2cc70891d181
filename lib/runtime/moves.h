// Moves: making a tensor's copy valid in a tier (MakeValid: room made, bytes moved, the trace
// event), a copy reserved for a caller to fill, an offload down. Owns the order in which moves
// take the link (LinkOrder). Calls the core, Room for space, Prefetcher to refill after an
// offload, WriteThrough for the clean DRAM copies, RecomputeCallbacks for dropped tensors.
#pragma once

#include "lib/runtime/core.h"

namespace tiermem {

class Room;
class Prefetcher;
class WriteThrough;
class RecomputeCallbacks;

class Moves {
 public:
  Moves(Core& core, Room& room, Prefetcher& prefetcher, WriteThrough& write_through,
        RecomputeCallbacks& recompute)
      : core_(core),
        room_(room),
        prefetcher_(prefetcher),
        write_through_(write_through),
        recompute_(recompute) {}
  Moves(const Moves&) = delete;
  Moves& operator=(const Moves&) = delete;

  // Makes t's copy in `dst` valid (a claimed tensor). Releases the lock during the move, and
  // while evicting to make room.
  absl::Status MakeValid(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                         DropReason* why = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Starts a scheduled prefetch of t into HBM from its DRAM copy on the calling thread (see
  // Prefetcher::Start): room from free space only (do no harm still applies), the copy only
  // enqueued, t's HBM copy landing (the acquire that uses it waits for its ticket) and the DRAM
  // copy in use until it has passed. False when it cannot start so (t busy or changed, room
  // that needs eviction, memory a copy down still reads): a mover runs it then. A copy the
  // engine refuses is recorded as the prefetch's failure (true).
  bool StartPrefetch(Tensor& t, uint64_t horizon) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Reserves t's copy in `tier` to be filled whole by the caller (kFilling). *made_room (when
  // given) says whether the tier had no free hole for it: room was made (see Allocate).
  absl::Status Reserve(Tensor& t, tm_tier tier, bool* made_room = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Moves a claimed tensor down to `tier` and frees the copies above (but a clean DRAM copy, see
  // WriteThrough::PlanKeep).
  absl::Status OffloadClaimed(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  // MakeValid of a tensor dropped for recompute: room made in `dst`, filled by its callback
  // (RecomputeCallbacks::Fill).
  absl::Status Rebuild(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                       DropReason* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Inclusive DRAM, upward: the DRAM copy WriteThrough asks for before a move of t from NVMe to
  // HBM (ReadThroughWant), made; whether it was.
  bool ReadThroughDram(Tensor& t, Want want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Space for t in `tier` (Room::Allocate), the victims Room asks to write down written down
  // first (MakeValid one tier down).
  absl::StatusOr<Extent> Allocate(Tensor& t, tm_tier tier, Want want, DropReason* why,
                                  bool* made_room = nullptr,
                                  std::vector<RangeFence>* behind = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The plan of MakeValid's move, its destination reserved; its trace event (t busy, unlocked).
  MovePlan PrepareMove(Tensor& t, tm_tier dst, const Extent& extent, const CallerStream& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // A copy that MakeValid or StartPrefetch left in flight: t's destination copy lands, and its
  // source stays in use until the copy has passed.
  void Land(Tensor& t, const MovePlan& plan, const io::CopyTicket& ticket, bool vacated)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  void TraceMove(const Tensor& t, const MovePlan& plan, Trace::Clock::time_point start,
                 bool vacated) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  Room& room_;
  Prefetcher& prefetcher_;
  WriteThrough& write_through_;
  RecomputeCallbacks& recompute_;
  LinkOrder link_order_;  // its own lock: taken without the runtime's
};

}  // namespace tiermem
