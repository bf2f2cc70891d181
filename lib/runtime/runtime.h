// The runtime: the device, the three tiers, the engines and the tensors, behind one C++ API
// that lib/c_api exposes as the C ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "io/device.h"
#include "io/io_engine.h"
#include "io/numa.h"
#include "io/sync.h"
#include "lib/config/config.h"
#include "lib/move/mover.h"
#include "lib/move/staging_ring.h"
#include "lib/policy/eviction.h"
#include "lib/policy/schedule.h"
#include "lib/runtime/counters.h"
#include "lib/runtime/deferred_frees.h"
#include "lib/runtime/failure_log.h"
#include "lib/runtime/job_queue.h"
#include "lib/runtime/link_order.h"
#include "lib/runtime/room_token.h"
#include "lib/runtime/tensor.h"
#include "lib/tiers/tiers.h"
#include "lib/trace/trace.h"
#include "tiermem/tiermem.h"

namespace tiermem {

struct TensorDesc {
  uint64_t bytes = 0;
  tm_tensor_class cls = TM_CLASS_OTHER;
  int home_tier = TM_TIER_BY_PLACEMENT;
  std::string name;
};

// What the runtime found when it set itself up, for tiermem-probe, logs and tm_runtime_info.
struct RuntimeInfo {
  std::string device;       // Device::Describe()
  std::string device_kind;  // "cuda" | "emulated"
  int cuda_device = -1;     // the CUDA ordinal in use; -1 with the emulated device
  std::string no_gpu;       // with the emulated device: why no GPU is used
  int numa_node = -1;       // node the DRAM tier is bound to, -1 when unbound
  int numa_nodes = 1;
  std::string io_engine;  // "uring" | "posix"
  bool io_buffers_registered = false;
  bool io_files_registered = false;
  uint64_t staging_chunk = 0;  // bytes per staging slot
  uint32_t staging_slots = 0;
  uint64_t tier_bytes[TM_TIER_COUNT] = {0, 0, 0};  // resolved budgets
  uint64_t prefetch_bytes = 0;                     // resolved TIERMEM_PREFETCH_BYTES
  struct Path {
    std::string dir;
    bool direct = false;
    uint32_t alignment = 1;
    std::string alignment_source;
    uint64_t bytes = 0;
  };
  std::vector<Path> nvme;
};

class Runtime {
 public:
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Config& config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  absl::StatusOr<uint64_t> CreateTensor(const TensorDesc& desc);
  absl::Status DestroyTensor(uint64_t handle);
  absl::StatusOr<uint64_t> TensorBytes(uint64_t handle);
  // Copies host memory into the tensor; a use for the schedule (the tier it lands in).
  absl::Status Write(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes);
  absl::Status Read(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes);
  absl::StatusOr<void*> Acquire(uint64_t handle, tm_tier tier, tm_access access, void* stream);
  absl::Status Release(uint64_t handle, tm_tier tier);
  // Release once the work queued on `stream` so far has passed (an event; the host does not wait).
  absl::Status ReleaseOnStream(uint64_t handle, tm_tier tier, void* stream);
  // The caller's host or device memory into / out of the tensor, enqueued and ordered on
  // `stream` (see tm_tensor_copy_in / tm_tensor_copy_out).
  // stream_waits == false: tm_tensor_copy_in_async (the stream's later work does not wait).
  absl::Status CopyIn(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes,
                      void* stream, bool stream_waits = true);
  // Whether no copy between the tensor and callers' memory is in flight (tm_tensor_copy_done).
  absl::StatusOr<bool> CopyDone(uint64_t handle);
  absl::Status CopyOut(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes, void* stream);
  // Asynchronous: queued, and return at once. A prefetch is a hint: dropped (and counted) when
  // it cannot be done. An offload's failure is kept until Sync, SyncAll or StepEnd reports it.
  absl::Status Prefetch(uint64_t handle, tm_tier tier);
  absl::Status Offload(uint64_t handle, tm_tier tier);
  // Waits for the tensor's queued and running moves; returns (and forgets) its failures.
  absl::Status Sync(uint64_t handle);
  // Waits for every queued and running move; returns (and forgets) every kept failure,
  // destroyed tensors' included.
  absl::Status SyncAll();
  // Each pair of tensors of equal size exchanges its copies (every tier's), all pairs at once or
  // none: a commit of versions written aside (the CPU Adam's shadow state). TM_ERR_BUSY while
  // one is acquired or landing; waits for their queued moves. (swap_contents.cc)
  absl::Status SwapContents(const std::vector<std::pair<uint64_t, uint64_t>>& pairs);
  // An Adam step's hold on its state tensor: TM_ERR_BUSY (nothing held) while a caller holds
  // it acquired or another step holds it; then, until UnholdForStep from the same thread, writes
  // by other threads (tm_tensor_write, copy_in, an acquire for writing) get TM_ERR_BUSY instead
  // of being lost to the step's commit.
  absl::Status HoldForStep(uint64_t handle);
  void UnholdForStep(uint64_t handle);
  absl::StatusOr<uint32_t> Residency(uint64_t handle);
  // Steps and the schedule (see Schedule).
  absl::Status StepBegin();
  // Ends the step; returns (and forgets) the failures kept so far, without waiting.
  absl::Status StepEnd();
  struct ScheduledUse {
    uint64_t handle = 0;
    tm_tier tier = TM_TIER_HBM;
  };
  absl::Status SetSchedule(const std::vector<ScheduledUse>& uses);
  // Gives the tensor a recompute callback and its cost, or clears it (fn nullptr), rebuilding a
  // dropped tensor first (tm_tensor_set_recompute; recompute.cc).
  absl::Status SetRecompute(uint64_t handle, tm_recompute_fn fn, void* user, double cost_seconds);

  tm_stats Stats();
  // For tests: how many calls have waited for another thread's move of their tensor, so that a
  // test knows a thread has got that far (tests/demand_wait_test.cc). Not in tm_stats.
  uint64_t MoveWaits();
  // For tests and tools: the blocks of a tier in address order, with their owners' handles.
  std::vector<TierSpace::Block> Layout(tm_tier tier) { return tiers_->space(tier).Layout(); }
  // Bytes a tensor of `bytes` takes in `tier` (its granule); 0 when it exceeds the tier.
  uint64_t Rounded(tm_tier tier, uint64_t bytes) { return tiers_->space(tier).Rounded(bytes); }
  const Config& config() const { return config_; }
  const RuntimeInfo& info() const { return info_; }
  // The HBM tier's backend, for tiermem-probe's copy measurements.
  io::Device& device() { return *device_; }
  // The machine's topology (nullptr when hwloc could not load it), for binding host buffers
  // where the DRAM tier is (info().numa_node).
  const io::Topology* topology() const { return topology_.get(); }

 private:
  // Who asks for room, and what it may do to get it.
  struct Want {
    enum Kind {
      kDemand,    // acquire, write, offload, an eviction's write-down for them: waits for moves
                  // in flight and cancels queued prefetches; fails only when nothing can help
      kHint,      // tm_tensor_prefetch: evicts what is unpinned, never waits; dropped when short
      kPrefetch,  // a scheduled prefetch serving the use at `horizon`: do no harm (see Allocate)
    } kind = kDemand;
    uint64_t horizon = Schedule::kNever;
    // The outermost demand move of an operation holding the room token: the token is handed
    // back once the room is made, before the bytes move, so that other demands need not wait
    // for this move (evictions' write-downs keep it: they are part of making room).
    bool release_room = false;
    // false: take only free room, evict nothing (a write-through's clean DRAM copy, which is
    // worth keeping only when it costs no other copy its place).
    bool evicts = true;
    // A copy down from HBM to DRAM whose HBM copy goes after it (an offload, an eviction's
    // write-down): its memory is handed on as it runs (Vacate). With `lands`, it is not
    // waited for then: the DRAM copy lands (an eviction's, so that the move evicting follows).
    bool vacates = false, lands = false;
  };
  static Want Demand() { return Want{Want::kDemand, Schedule::kNever, true}; }

  explicit Runtime(Config config) : config_(std::move(config)) {}
  // Set-up (setup.cc), in the order Init runs them.
  struct Setup;
  absl::Status Init();
  // The CUDA device (or the emulated one) and the device backend.
  absl::Status InitDevice(Setup& st);
  // The NUMA node of the DRAM tier: the GPU's, else this thread's.
  absl::Status InitNuma(Setup& st);
  // The HBM tier's budget (a share of the device split over the ranks using it) and the tier.
  absl::StatusOr<std::unique_ptr<MemoryTier>> InitHbm(Setup& st);
  // NVMe first (its alignment is the granule of DRAM copies), then DRAM with the staging ring.
  absl::Status InitLowerTiers(Setup& st, std::unique_ptr<MemoryTier> hbm);
  // The I/O engine, the staging ring, checksums, the mover, the trace, the prefetch limit.
  absl::Status InitEngines(Setup& st);
  void StartMovers(const Setup& st);

  // ---- the move protocol (moves.cc) ----
  // The tensor of `handle`, or TM_ERR_INVALID_HANDLE.
  absl::StatusOr<Tensor*> Find(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live tensor that the schedule's `key` names now (the newest created), or nullptr.
  Tensor* FindKey(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tensor of `handle` once no operation of another thread runs on it and its landing copy
  // (if any) has landed: the caller may then change it. May release and retake the lock.
  // With land == false the landing copy may still be in flight (a reader orders itself after
  // its ticket instead).
  // TM_ERR_BUSY when the tensor is busy by this very thread (see NotBusyByThisThread).
  absl::StatusOr<Tensor*> Claim(uint64_t handle, bool land = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits while another thread moves the tensor; returns at once when it is gone or busy by this
  // thread (Claim says so). A request for room (RoomScope) waits so before it takes the room
  // token: holding the token through another thread's move of its tensor (a prefetch landing,
  // an eviction writing it down) would hold every other request for room with it.
  void WaitWhileMoving(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TM_ERR_BUSY, naming the tensor, when it is busy by the calling thread: a callback of this
  // thread (a recompute rebuilding it) called back in with it, and waiting would never end.
  static absl::Status NotBusyByThisThread(const Tensor& t);
  // TM_ERR_BUSY, naming the tensor and `what` was refused, while a step on another thread
  // holds it (HoldForStep).
  static absl::Status CheckNotHeld(const Tensor& t, absl::string_view what);
  // Runs `f` without the lock while the tensor is busy (by this thread).
  template <typename F>
  absl::Status Unlocked(Tensor& t, F&& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the ticket of t's landing copy (the host waits); a failed copy is dropped and
  // recorded.
  void WaitLanded(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The room token (see RoomToken), held for a scope by RoomScope.
  class RoomScope;

  // A caller's stream for a stream-ordered move: the copy starts after `fence` (recorded on the
  // stream when the call came in) and the stream waits for the copy.
  struct CallerStream {
    void* stream = nullptr;
    io::FencePtr fence;
  };
  // Makes t's copy in `dst` valid (a claimed tensor). Releases the lock during the move, and
  // while evicting to make room.
  absl::Status MakeValid(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                         DropReason* why = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan of MakeValid's move, its destination reserved; its trace event (t busy, unlocked).
  MovePlan PrepareMove(Tensor& t, tm_tier dst, const Extent& extent, const CallerStream& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TraceMove(const Tensor& t, const MovePlan& plan, Trace::Clock::time_point start,
                 bool vacated) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // The fences of t's copy in `tier` that have not passed yet (the passed ones are forgotten).
  std::vector<io::FencePtr> PendingUses(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the deferred extents whose uses have passed; true when any of `tier` remain.
  bool ReapDeferred(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the uses of every deferred free, then frees them (tm_runtime_sync). May release
  // the lock.
  void SettleDeferred() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves t's copy in `tier` to be filled whole by the caller (kFilling). *made_room (when
  // given) says whether the tier had no free hole for it: room was made (see Allocate).
  absl::Status Reserve(Tensor& t, tm_tier tier, bool* made_room = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees t's copy in `tier` and its space (deferred while callers' work may use it).
  void FreeCopy(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a claimed tensor down to `tier` and frees the copies above (but a clean DRAM copy, see
  // KeepCleanDramCopy).
  absl::Status OffloadClaimed(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Inclusive DRAM (write_through.cc): before an offload of t to NVMe, makes sure t has a DRAM
  // copy to keep once NVMe holds the bytes, when TIERMEM_DRAM_INCLUSIVE is on and DRAM has free
  // room that no earlier scheduled use needs. Copies it down from HBM when needed (evicting
  // nothing). Returns whether t's DRAM copy is to be kept; `made`: it was made here (freed again
  // when the offload fails).
  bool KeepCleanDramCopy(Tensor& t, bool* made) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Inclusive DRAM, upward: before a prefetch (or hint) moves t from NVMe to HBM, makes a DRAM
  // copy of it in free room under the same rules, so that the move up reads DRAM and the copy
  // stays for later steps. Returns whether it made one.
  bool ReadThroughDram(Tensor& t, Want want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Want of a clean DRAM copy of t (free room only, do no harm); false: t is not used again
  // this step, so keeping a copy serves nothing.
  bool CleanCopyWant(const Tensor& t, Want* want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a read of t's bytes upward (a move to HBM, a copy out to a caller) from `src`, when
  // that was a clean DRAM copy read instead of NVMe (write_through.cc).
  void NoteCleanRead(const Tensor& t, int src, uint64_t bytes, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for an acquire in DRAM for reading, the first after the copy was kept.
  void NoteCleanDramAcquire(Tensor& t, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TM_ERR_BUSY when a copy other than `keep` is pinned (it would have to be freed).
  absl::Status CheckOthersUnpinned(const Tensor& t, int keep) const;
  // TM_ERR_BUSY when a copy above `tier` is pinned.
  absl::Status CheckAboveUnpinned(const Tensor& t, tm_tier tier) const;
  // Frees every copy except the one in `keep`: they became stale.
  void DropOthers(Tensor& t, tm_tier keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps an asynchronous failure until a sync or step end reports it.
  void RecordFailure(const Tensor& t, absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- callers' copies (caller_copy.cc) ----
  struct CallerCopyRequest;
  // The one path of CopyIn, Write (into) and CopyOut, Read (out of the tensor).
  absl::Status CallerCopy(const char* fn, uint64_t handle, uint64_t offset, void* buffer,
                          uint64_t bytes, void* stream, bool into, bool wait,
                          bool stream_waits = true);
  // Zeros into the caller's buffer: the tensor was never written.
  absl::Status ReadZeros(Tensor& t, const CallerCopyRequest& r, CallerBuffer& buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CopyInto(const CallerCopyRequest& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CopyFrom(const CallerCopyRequest& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites a claimed tensor on NVMe with [offset, +bytes) from the caller's buffer, through
  // staging into a fresh extent that replaces the old one only once complete.
  absl::Status RewriteOnNvme(Tensor& t, const CallerCopyRequest& r, CallerBuffer& buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues (or, host to host with nothing to wait for, does) the copy between `addr` in
  // `tier` and the caller's buffer; with r.wait, returns once it is done.
  // With neither, a ticket of the copy in flight; refuses a buffer overlapping the copy.
  absl::StatusOr<std::optional<io::CopyTicket>> CopyTierAndCaller(
      Tensor& t, tm_tier tier, char* addr, const CallerCopyRequest& r, CallerBuffer& buffer,
      bool into_tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the failures of the callers' copies that are done (all of them when `wait`, only
  // those of `handle` unless it is 0). May release the lock to wait.
  void ReapCallerCopies(uint64_t handle, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fence on the caller's stream, or none without a stream.
  absl::StatusOr<io::FencePtr> StreamFence(void* stream, const char* function);

  // ---- room and eviction (room.cc) ----
  // Space for t in `tier`: evicts the cheapest window of copies when the tier is full, waits
  // for moves in flight when a demand finds nothing to evict. *made_room (when given) is set
  // when the first try found no hole: copies were evicted or slid, or the call waited.
  // In HBM where copies down still read (Vacate): their fences go to *behind, for the caller
  // to write after; without `behind`, Allocate waits for them.
  absl::StatusOr<Extent> Allocate(Tensor& t, tm_tier tier, Want want, DropReason* why,
                                  bool* made_room = nullptr,
                                  std::vector<RangeFence>* behind = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct AllocateState;
  // Allocate's loop: allocates, else evicts a window, waits (a demand) or gives up.
  absl::StatusOr<Extent> MakeRoom(Tensor& t, tm_tier tier, Want want, uint64_t need,
                                  DropReason* why, AllocateState& st)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Do no harm: whether a scheduled prefetch may take `need` bytes in `tier` at all.
  absl::Status AdmitPrefetch(Tensor& t, tm_tier tier, Want want, uint64_t need, DropReason* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the victims of a window to make room for `t`; an error ends the allocation.
  struct EvictionPlan;
  absl::Status EvictWindow(const Tensor& t, const EvictionPlan& plan, tm_tier tier, Want want,
                           bool fragmented, DropReason* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a demand for `t` that cannot fit even with every unpinned copy evicted.
  absl::Status OutOfRoom(const absl::Status& failed, EvictionPlan& plan, const Tensor& t,
                         tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a request for `t` larger than the whole of `tier`.
  absl::Status NeverFits(const absl::Status& failed, const Tensor& t, tm_tier tier);
  // For an out-of-memory message in `tier`: that the mapped HBM layout gives copies whole chunks,
  // and what that makes of a request of `bytes` (2.1 MiB take 4 MiB); "" in other layouts.
  std::string ChunkRounding(tm_tier tier, uint64_t bytes);
  // What eviction could do for a request of `need` bytes in `tier` (see Allocate).
  EvictionPlan PlanEviction(const Tensor& t, tm_tier tier, Want want, uint64_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compaction (compaction.cc): slides copies nobody holds down into the holes before them
  // until a hole of `need` bytes forms; true when any copy moved.
  bool Compact(tm_tier tier, uint64_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- memory handed on behind a copy down (vacate.cc) ----
  // Whether t's move down to `dst` may hand its HBM memory on (want.vacates, the slab layout);
  // OfferVacate sets plan.on_vacate then, which sets *vacated when it does (Vacate: frees t's
  // HBM copy at `extent`, its parts fenced by the pieces; false when the copy changed, or an
  // acquire waits for it in HBM). BehindFences: the fences over [offset, offset + size).
  bool MayVacate(const Tensor& t, tm_tier dst, Want want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OfferVacate(Tensor& t, MovePlan& plan, Want want, bool* vacated)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Vacate(Tensor& t, const Extent& extent, std::vector<RangeFence> pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<RangeFence> BehindFences(tm_tier tier, uint64_t offset, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With free bytes enough but split: compacts instead of evicting plan's window when that
  // window takes copies used again and the slide moves no more bytes; true when it did.
  bool SlidRatherThanEvict(const EvictionPlan& plan, tm_tier tier, uint64_t need, AllocateState& st)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes Compact would slide to form that hole, moving nothing; nullopt when it would not
  // form one.
  std::optional<uint64_t> CompactionBytes(tm_tier tier, uint64_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Slidable(Tensor& v, tm_tier tier, uint64_t shift) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SlideDown(Tensor& v, tm_tier tier, uint64_t shift) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compact's pass over the layout; slide(v, shift) moves one copy (false: it stays, a wall).
  // True when a hole of `need` bytes forms.
  template <typename Slide>
  bool CompactionPass(tm_tier tier, uint64_t need, Slide&& slide)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How soon the memory of `owner`'s copy in `tier` is free again (lower: sooner), for placing
  // a new extent beside it (TierSpace::Allocate).
  uint64_t FreesAfter(uint64_t owner, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The room that scheduled uses before `horizon` still need in `tier` (do-no-harm): each
  // use's position and bytes, in order.
  std::vector<std::pair<uint64_t, uint64_t>> NeededBefore(const Tensor& t, tm_tier tier,
                                                          uint64_t horizon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copies in `tier` acquired now that the recorded step lets go before `horizon` and that
  // then cost nothing to drop (clean, not used again before `horizon`): the position of the use
  // each is released before, and its bytes.
  std::vector<std::pair<uint64_t, uint64_t>> ReleasedBefore(const Tensor& t, tm_tier tier,
                                                            uint64_t horizon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One copy of ReleasedBefore: the position of the use it is let go before (when < horizon).
  std::optional<uint64_t> LetGoBefore(const Tensor& v, const Tensor& t, tm_tier tier,
                                      uint64_t horizon) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
                   std::optional<Placed> placed = std::nullopt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The hole plan's window leaves (with the free blocks beside it), and the `need` bytes a
  // request would take there.
  static Placed WindowPlaced(const EvictionPlan& plan, uint64_t need);
  // Frees v's copy in `tier`: dropped when another copy is valid, written down first if not.
  // `for_whom` is the tensor the room is for (the trace says whose room and why).
  absl::Status Evict(Tensor& v, tm_tier tier, Want want, const std::string& for_whom)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the queued (not yet started) prefetches into `tier`: a demand needs the room.
  void CancelPrefetches(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- prefetch and the schedule (prefetch.cc) ----
  // Queues prefetches for the scheduled uses ahead of the current position.
  void IssuePrefetches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops t's offloads still queued (not a running one): t is used within 2 x the depth.
  void CancelQueuedOffloads(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the schedule reads t within 2 x the prefetch depth (the uses IssuePrefetches sees)
  // and the tier of that read holds it until then beside everything used before it: then its
  // offload is superseded (dropped or skipped); otherwise the offload runs.
  bool UsedSoon(const Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes a use of t for the schedule and the LRU order, then prefetches ahead.
  void NoteUse(Tensor& t, tm_tier tier, bool fill) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  tm_tier HomeOf(tm_tensor_class cls) const;
  // The schedule key of a new tensor (see Schedule).
  uint64_t KeyFor(const TensorDesc& desc, uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- recompute callbacks (recompute.cc) ----
  // The bandwidth per direction, GB/s, of the link from `tier` to the tier below.
  double RecomputeGbps(tm_tier tier) const;
  // Whether evicting t's only copy in `tier` drops it for its recompute callback instead of
  // writing it down: the callback costs less than the round trip down and back up.
  bool DropsForRecompute(const Tensor& t, tm_tier tier) const;
  // Frees v's only copy in `tier`: the tensor is dropped. Counted as an eviction.
  void DropForRecompute(Tensor& v, tm_tier tier, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // MakeValid of a dropped tensor: calls its callback, without the lock, to fill `dst`. Only a
  // demand rebuilds; a prefetch is dropped.
  absl::Status Recompute(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                         DropReason* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rebuilds a dropped, claimed tensor for a caller's copy: in DRAM (HBM when it exceeds the DRAM
  // tier). The caller holds the room token.
  absl::Status RebuildForCaller(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- the job queue (job_queue.cc) ----
  // Queues an asynchronous move.
  absl::Status Enqueue(uint64_t handle, tm_tier tier, JobKind kind);
  // A mover thread: runs queued moves until the runtime stops.
  void MoverLoop();
  // Runs one job on its claimed tensor; the failure to keep, if any.
  absl::Status RunJob(Tensor& t, const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parked offloads: an asynchronous offload that found no room while callers held copies
  // waits for a release (or a destroy) to be queued again, rather than fail at once; a sync
  // runs it on the caller's thread, where no room is an error.
  // Queues again those parked for `freed` (all of them when nullopt: a destroy frees every tier).
  void RequeueParkedOffloads(std::optional<tm_tier> freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPinned(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // a caller holds a copy
  void RunParkedOffload(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Config config_;
  RuntimeInfo info_;
  std::unique_ptr<io::Topology> topology_;
  std::unique_ptr<io::Device> device_;
  std::unique_ptr<Tiers> tiers_;
  std::unique_ptr<io::IoEngine> io_;
  std::unique_ptr<StagingRing> staging_;
  std::unique_ptr<Mover> mover_;

  // Guards the tensor table, every tensor's state, the schedule and the components below. Moves
  // run without it: a tensor being moved is busy instead, and only its own operations wait.
  // Lock order: mu_, then a TierSpace's lock, then the staging ring's; the engines' locks are
  // leaves. Nothing takes mu_ while holding one of those.
  Mutex mu_;
  CondVar changed_;  // a tensor stopped being busy, a job finished, the room token was freed
  CondVar work_;     // a job was queued, or the runtime stops
  TensorTable tensors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> keyed_ ABSL_GUARDED_BY(mu_);  // key -> newest handle
  uint64_t created_in_step_ ABSL_GUARDED_BY(mu_) = 0;  // tensors created in this step
  JobQueue jobs_ ABSL_GUARDED_BY(mu_);
  LinkOrder link_order_;  // its own lock: taken without mu_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RoomToken room_ ABSL_GUARDED_BY(mu_);
  FailureLog failures_ ABSL_GUARDED_BY(mu_);
  DeferredFrees deferred_ ABSL_GUARDED_BY(mu_);
  // Parts of HBM handed on while copies down read them (Vacate): written after their fences.
  std::vector<RangeFence> vacating_ ABSL_GUARDED_BY(mu_);
  // Copies between tensors and callers' memory (tm_tensor_copy_in / copy_out) not yet reaped:
  // their outcome is reported by tm_tensor_sync, tm_runtime_sync or tm_step_end.
  struct CopyInFlight {
    uint64_t handle;
    std::string tensor;
    const char* what;  // "copy_in" | "copy_out"
    io::CopyTicket ticket;
  };
  std::vector<CopyInFlight> caller_copies_ ABSL_GUARDED_BY(mu_);
  Schedule schedule_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  // Handles that an acquire in HBM is waiting to claim, with the number of such acquires: an
  // offload that finishes meanwhile keeps their HBM copy (see OffloadClaimed).
  absl::flat_hash_map<uint64_t, uint32_t> wanted_in_hbm_ ABSL_GUARDED_BY(mu_);
  // Offloads parked until a release, by handle, with their target tier (job_queue.cc).
  absl::flat_hash_map<uint64_t, tm_tier> parked_offloads_ ABSL_GUARDED_BY(mu_);
  uint64_t prefetch_limit_ = 0;  // bytes
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Trace> trace_;
  std::vector<std::thread> movers_;
};

}  // namespace tiermem
