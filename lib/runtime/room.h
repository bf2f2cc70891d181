// Room in a tier: allocation, eviction (the cheapest window), do-no-harm admission of scheduled
// prefetches (admission.cc), compaction of HBM (compaction.cc), and HBM memory handed on behind
// a copy down (vacate.cc). Owns the parts of HBM so handed on (vacating_). Decides; never moves
// bytes: a victim that must be written down first is handed back to the caller (Moves) as a
// WriteDown, and the caller asks again. Calls the core, RecomputeCallbacks to drop a victim
// instead, Prefetcher for the schedule and to refill, MoveJobs to cancel queued prefetches.
#pragma once

#include "lib/runtime/core.h"

namespace tiermem {

class Prefetcher;
class MoveJobs;
class RecomputeCallbacks;

class Room {
 public:
  Room(Core& core, Prefetcher& prefetcher, MoveJobs& jobs, RecomputeCallbacks& recompute)
      : core_(core), prefetcher_(prefetcher), jobs_(jobs), recompute_(recompute) {}
  Room(const Room&) = delete;
  Room& operator=(const Room&) = delete;

  // One request for space: its arguments and Room's bookkeeping of it, carried by the caller
  // from one Allocate to the next across the write-downs Allocate asks for. The caller makes it
  // and reads victims(); the rest is Room's.
  class Request {
   public:
    Request(Tensor& tensor, tm_tier in, Want w, DropReason* why_out, bool* made_room_out,
            std::vector<RangeFence>* behind_out)
        : t_(tensor),
          tier_(in),
          want_(w),
          why_(why_out),
          made_room_(made_room_out),
          behind_(behind_out) {}
    // The window to evict before asking again, in order (after Allocate returned nullopt).
    const std::vector<uint64_t>& victims() const { return victims_; }

   private:
    friend class Room;
    Tensor& t_;
    const tm_tier tier_;
    const Want want_;
    DropReason* const why_;
    bool* const made_room_;
    std::vector<RangeFence>* const behind_;
    bool admitted_ = false;         // the do-no-harm admission passed
    bool wanting_ = false;          // registered as a demand wanting room (Core::WantRoom)
    bool waited_ = false;           // waited for moves in flight or for copies down
    bool backing_retried_ = false;  // the framework's allocator was asked again after evicting
    bool compacted_ = false;        // HBM compaction was tried
    bool room_made_ = false;        // the first try found no hole
    bool fragmented_ = false;       // the victims clear contiguity, not bytes
    std::string for_whom_;          // t's name, for the trace of evictions
    Trace::Clock::time_point start_ = Trace::Clock::now();
    std::vector<uint64_t> victims_;
  };
  // A victim's copy to write one tier down before its memory is free: the caller moves it
  // (to `to` with `want`; from HBM, when DRAM has no room for it, to NVMe) and says how that
  // went with WrittenDown.
  struct WriteDown {
    tm_tier from, to;
    Want want;
    Trace::Clock::time_point start;
  };

  // Space for the request's tensor in its tier: evicts the cheapest window of copies when the tier
  // is full, waits for moves in flight when a demand finds nothing to evict. nullopt: evict
  // req.victims() first (each through Evict, and WrittenDown where Evict asks for a write-down),
  // then call again with the same req. *made_room (when given) is set when the first try found
  // no hole: copies were evicted or slid, or the call waited. In HBM where copies down still
  // read (Vacate): their fences go to *behind, for the caller to write after; without
  // `behind`, Allocate waits for them.
  std::optional<absl::StatusOr<Extent>> Allocate(Request& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // One victim of req.victims(): its copy in the request's tier dropped (clean, or rebuilt by its
  // recompute callback) or left (changed since the window was planned); or the write-down it
  // needs first (then WrittenDown).
  std::optional<WriteDown> Evict(Request& req, Tensor& v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // After the write-down Evict asked for (its outcome s): v's copy freed when it still may be.
  // A failure ends the request: the error returned is Allocate's.
  absl::Status WrittenDown(Request& req, Tensor& v, const WriteDown& w, absl::Status s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Lets t's move down hand its HBM memory on as it runs, when it may (see MayVacate below):
  // sets plan.on_vacate, which sets *vacated when it does.
  void OfferVacate(Tensor& t, MovePlan& plan, Want want, bool* vacated)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Waits on the host for the moves down still reading HBM handed on (the runtime goes).
  void WaitVacating() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  struct EvictionPlan;
  // Allocate's loop: allocates, else plans a window to evict (nullopt: req.victims() set),
  // waits (a demand) or gives up.
  std::optional<absl::StatusOr<Extent>> MakeRoom(Request& req, uint64_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The copies plan's window evicts, in the order of the layout.
  static std::vector<uint64_t> Victims(const EvictionPlan& plan);
  // One try in the free holes (and, when none fits, again after reaping deferred frees).
  absl::StatusOr<Extent> TryAllocate(Tensor& t, tm_tier tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Allocate's end: the room wanted let go, the hole check of a prefetch, the fences behind.
  absl::StatusOr<Extent> Finish(Request& req, absl::StatusOr<Extent> result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // A copy evicted: freed, counted, traced.
  void Evicted(Request& req, Tensor& v, bool clean, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Do no harm: whether a scheduled prefetch may take `need` bytes in `tier` at all.
  absl::Status AdmitPrefetch(Tensor& t, tm_tier tier, Want want, uint64_t need, DropReason* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The error of a demand for `t` that cannot fit even with every unpinned copy evicted.
  absl::Status OutOfRoom(const absl::Status& failed, EvictionPlan& plan, const Tensor& t,
                         tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The error of a request for `t` larger than the whole of `tier`.
  absl::Status NeverFits(const absl::Status& failed, const Tensor& t, tm_tier tier);
  // For an out-of-memory message in `tier`: that the mapped HBM layout gives copies whole chunks,
  // and what that makes of a request of `bytes` (2.1 MiB take 4 MiB); "" in other layouts.
  std::string ChunkRounding(tm_tier tier, uint64_t bytes);
  // What eviction could do for a request of `need` bytes in `tier` (see Allocate).
  EvictionPlan PlanEviction(const Tensor& t, tm_tier tier, Want want, uint64_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Compaction (compaction.cc): slides copies nobody holds down into the holes before them
  // until a hole of `need` bytes forms; true when any copy moved.
  bool Compact(tm_tier tier, uint64_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Whether t's move down to `dst` may hand its HBM memory on (want.vacates, the slab layout);
  // OfferVacate sets plan.on_vacate then, which sets *vacated when it does (Vacate: frees t's
  // HBM copy at `extent`, its parts fenced by the pieces; false when the copy changed, or an
  // acquire waits for it in HBM). BehindFences: the fences over [offset, offset + size).
  bool MayVacate(const Tensor& t, tm_tier dst, Want want)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  bool Vacate(Tensor& t, const Extent& extent, std::vector<RangeFence> pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  std::vector<RangeFence> BehindFences(tm_tier tier, uint64_t offset, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // With free bytes enough but split: compacts instead of evicting plan's window when that
  // window takes copies used again and the slide moves no more bytes; true when it did.
  bool SlidRatherThanEvict(const EvictionPlan& plan, tm_tier tier, uint64_t need, Request& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The bytes Compact would slide to form that hole, moving nothing; nullopt when it would not
  // form one.
  std::optional<uint64_t> CompactionBytes(tm_tier tier, uint64_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  bool Slidable(Tensor& v, tm_tier tier, uint64_t shift)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  bool SlideDown(Tensor& v, tm_tier tier, uint64_t shift)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Compact's pass over the layout; slide(v, shift) moves one copy (false: it stays, a wall).
  // True when a hole of `need` bytes forms.
  template <typename Slide>
  bool CompactionPass(tm_tier tier, uint64_t need, Slide&& slide)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // How soon the memory of `owner`'s copy in `tier` is free again (lower: sooner), for placing
  // a new extent beside it (TierSpace::Allocate).
  uint64_t FreesAfter(uint64_t owner, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The room that scheduled uses before `horizon` still need in `tier` (do-no-harm): each
  // use's position and bytes, in order.
  std::vector<std::pair<uint64_t, uint64_t>> NeededBefore(const Tensor& t, tm_tier tier,
                                                          uint64_t horizon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The copies in `tier` acquired now that the recorded step lets go before `horizon` and that
  // then cost nothing to drop (clean, not used again before `horizon`): the position of the use
  // each is released before, and its bytes.
  std::vector<std::pair<uint64_t, uint64_t>> ReleasedBefore(const Tensor& t, tm_tier tier,
                                                            uint64_t horizon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // One copy of ReleasedBefore: the position of the use it is let go before (when < horizon).
  std::optional<uint64_t> LetGoBefore(const Tensor& v, const Tensor& t, tm_tier tier,
                                      uint64_t horizon) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Do no harm in a slab, after a prefetch of t took its extent: whether each earlier use that
  // still needs room there can find a hole of its bytes without evicting anything used before
  // t's use (copies let go before that use count as free).
  // With `placed`, the same judged before a window is evicted for t: t's `bytes` in the hole
  // [begin, end) the window would leave, so that no copy is evicted for a prefetch that the
  // check after its allocation would then drop.
  struct Placed {
    uint64_t begin = 0, end = 0, bytes = 0;
  };
  bool LeavesHoles(const Tensor& t, tm_tier tier, Want want,
                   std::optional<Placed> placed = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The hole plan's window leaves (with the free blocks beside it), and the `need` bytes a
  // request would take there.
  static Placed WindowPlaced(const EvictionPlan& plan, uint64_t need);

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  Prefetcher& prefetcher_;
  MoveJobs& jobs_;
  RecomputeCallbacks& recompute_;
  // Parts of HBM handed on while copies down read them (Vacate): written after their fences.
  std::vector<RangeFence> vacating_ ABSL_GUARDED_BY(runtime_lock);
};

}  // namespace tiermem
