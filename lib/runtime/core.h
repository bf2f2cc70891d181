// The runtime's shared core: the engines (device, tiers, I/O, staging, mover, trace), the lock and
// its condition variables, the tensor table, and what every part of the runtime uses under that
// lock: the claim protocol (a tensor busy, its landing copy waited for), the room token, freeing
// copies (deferred while callers' work may use them), the failures kept for a sync, the counters.
// It owns that state and calls no part: the parts (moves.h, room.h, prefetcher.h, movers.h,
// caller_copies.h, recompute.h, write_through.h) call it.
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
#include "lib/runtime/runtime_lock.h"
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
    bool reserved = true;  // its blocks reserved up front (false: no fallocate there)
  };
  std::vector<Path> nvme;
};

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
inline Want Demand() { return Want{Want::kDemand, Schedule::kNever, true}; }
// A caller's stream for a stream-ordered move: the copy starts after `fence` (recorded on the
// stream when the call came in) and the stream waits for the copy.
struct CallerStream {
  void* stream = nullptr;
  io::FencePtr fence;
};

class Core {
 public:
  explicit Core(Config config) : config_(std::move(config)) {}
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // ---- the lock (runtime_lock.h: the analysis names mu runtime_lock) ----
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION(runtime_lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.Lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION(runtime_lock) ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  // Waits on `cv`, giving mu back meanwhile.
  void Wait(CondVar& cv)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    cv.Wait(&mu_);
  }
  void WaitWithTimeout(CondVar& cv, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    cv.WaitWithTimeout(&mu_, timeout);
  }
  // The room token (RoomToken::Enter), waited for on `changed`.
  void EnterRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    room_.Enter(mu_, changed_);
  }

  // ---- the claim protocol (core.cc) ----
  // The tensor of `handle`, or TM_ERR_INVALID_HANDLE.
  absl::StatusOr<Tensor*> Find(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The tensor of `handle` once no operation of another thread runs on it and its landing copy
  // (if any) has landed: the caller may then change it. May release and retake the lock.
  // With land == false the landing copy may still be in flight (a reader orders itself after
  // its ticket instead).
  // TM_ERR_BUSY when the tensor is busy by this very thread (see NotBusyByThisThread).
  absl::StatusOr<Tensor*> Claim(uint64_t handle, bool land = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Waits while another thread moves the tensor; returns at once when it is gone or busy by this
  // thread (Claim says so). A request for room (RoomScope) waits so before it takes the room
  // token: holding the token through another thread's move of its tensor (a prefetch landing,
  // an eviction writing it down) would hold every other request for room with it.
  void WaitWhileMoving(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // TM_ERR_BUSY, naming the tensor, when it is busy by the calling thread: a callback of this
  // thread (a recompute rebuilding it) called back in with it, and waiting would never end.
  static absl::Status NotBusyByThisThread(const Tensor& t);
  // TM_ERR_BUSY, naming the tensor and `what` was refused, while a step on another thread
  // holds it (HoldForStep).
  static absl::Status CheckNotHeld(const Tensor& t, absl::string_view what);
  // Runs `f` without the lock while the tensor is busy (by this thread).
  template <typename F>
  absl::Status Unlocked(Tensor& t, F&& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Waits for the ticket of t's landing copy (the host waits); a failed copy is dropped and
  // recorded.
  void WaitLanded(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // The fences of t's copy in `tier` that have not passed yet (the passed ones are forgotten).
  std::vector<io::FencePtr> PendingUses(Tensor& t, tm_tier tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Frees the deferred extents whose uses have passed; true when any of `tier` remain.
  bool ReapDeferred(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Waits for the uses of every deferred free, then frees them (tm_runtime_sync). May release
  // the lock.
  void SettleDeferred() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Frees t's copy in `tier` and its space (deferred while callers' work may use it).
  void FreeCopy(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // TM_ERR_BUSY when a copy other than `keep` is pinned (it would have to be freed).
  absl::Status CheckOthersUnpinned(const Tensor& t, int keep) const;
  // TM_ERR_BUSY when a copy above `tier` is pinned.
  absl::Status CheckAboveUnpinned(const Tensor& t, tm_tier tier) const;
  // Frees every copy except the one in `keep`: they became stale.
  void DropOthers(Tensor& t, tm_tier keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Keeps an asynchronous failure until a sync or step end reports it.
  void RecordFailure(const Tensor& t, absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // ---- the engines: set up by Runtime::Init (setup.cc), then fixed ----
  const Config& config() const { return config_; }
  const RuntimeInfo& info() const { return info_; }
  io::Topology* topology() const { return topology_.get(); }
  io::Device* device() const { return device_.get(); }
  Tiers* tiers() const { return tiers_.get(); }
  io::IoEngine* io() const { return io_.get(); }
  StagingRing* staging() const { return staging_.get(); }
  Mover* mover() const { return mover_.get(); }
  Trace* trace() const { return trace_.get(); }
  // For Runtime::Init only.
  Config& mutable_config() { return config_; }
  RuntimeInfo& mutable_info() { return info_; }
  void set_topology(std::unique_ptr<io::Topology> p) { topology_ = std::move(p); }
  void set_device(std::unique_ptr<io::Device> p) { device_ = std::move(p); }
  void set_tiers(std::unique_ptr<Tiers> p) { tiers_ = std::move(p); }
  void set_io(std::unique_ptr<io::IoEngine> p) { io_ = std::move(p); }
  void set_staging(std::unique_ptr<StagingRing> p) { staging_ = std::move(p); }
  void set_mover(std::unique_ptr<Mover> p) { mover_ = std::move(p); }
  void set_trace(std::unique_ptr<Trace> p) { trace_ = std::move(p); }

  // ---- the tensor table ----
  // The tensor of `handle`, nullptr when there is none (Find says why, Claim waits for it). An
  // orphaned one (destroyed while DLPack exports pin it, Tensor::orphaned) is found here only.
  Tensor* Lookup(uint64_t handle) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return tensors_.Find(handle);
  }
  uint64_t AddTensor(std::unique_ptr<Tensor> t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return tensors_.Insert(std::move(t));
  }
  std::unique_ptr<Tensor> RemoveTensor(uint64_t handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return tensors_.Remove(handle);
  }
  template <typename F>
  void ForEachTensor(F&& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    tensors_.ForEach(std::forward<F>(f));
  }
  size_t tensor_count() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return tensors_.size();
  }

  // ---- something changed: a tensor stopped being busy, a job finished, room was freed ----
  void NotifyChanged() { changed_.SignalAll(); }
  void WaitForChange() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { Wait(changed_); }
  void WaitForChange(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    WaitWithTimeout(changed_, timeout);
  }

  // ---- the room token (RoomScope holds it) ----
  uint64_t room_generation() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return room_.generation();
  }
  bool RoomHeldByMe() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return room_.HeldByMe(); }
  void LeaveRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { room_.Leave(changed_); }
  // Hands the token back once a move has made its room (RoomToken::Release).
  void ReleaseRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { room_.Release(changed_); }
  // Scheduled requests waiting for room in `tier` (a prefetch defers to them).
  void WantRoom(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { ++room_.wanted(tier); }
  void UnwantRoom(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    --room_.wanted(tier);
  }
  bool RoomWanted(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return room_.wanted(tier) > 0;
  }

  // ---- deferred frees (besides FreeCopy, ReapDeferred, SettleDeferred above) ----
  void ReapAllDeferred() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { deferred_.ReapAll(*tiers_); }
  // Frees what can be in `tier`, handed-on HBM memory included, for a request for room.
  void ReapDeferredForRoom(tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    deferred_.ReapForRoom(*tiers_, tier);
  }
  bool HasDeferred() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return !deferred_.empty();
  }
  // Whether memory at `offset` of `tier` was handed on behind a copy down still running.
  bool HandedOnAt(tm_tier tier, uint64_t offset) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return deferred_.HandedOnAt(tier, offset);
  }
  // HBM memory handed on behind the copies down that read it (`fences`): freed once they pass.
  void DeferHandedOn(Extent e, std::vector<io::FencePtr> fences)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    deferred_.Add(*tiers_, TM_TIER_HBM, e, std::move(fences), /*handed_on=*/true);
  }
  std::vector<io::FencePtr> DeferredFences() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return deferred_.Fences();
  }

  // ---- failures kept for a sync ----
  // A callers' copy's failure (its bytes did not land): not kept.
  void RecordFailure(uint64_t handle, std::string tensor, absl::Status s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    failures_.Record(handle, std::move(tensor), std::move(s), /*kept=*/false);
  }
  // The first failure kept for `handle` (0: any), forgotten.
  absl::Status TakeFailure(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return failures_.Take(handle);
  }

  // ---- acquires in HBM waiting to claim a tensor: an offload finishing meanwhile keeps its
  // HBM copy (see Moves::OffloadClaimed) ----
  void WantInHbm(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    ++wanted_in_hbm_[handle];
  }
  void UnwantInHbm(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    if (--wanted_in_hbm_[handle] == 0) wanted_in_hbm_.erase(handle);
  }
  bool WantedInHbm(uint64_t handle) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
    return wanted_in_hbm_.contains(handle);
  }

  // What the claim protocol counted (move waits, failed moves); Runtime::Stats adds every
  // part's up.
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  Config config_;
  RuntimeInfo info_;
  std::unique_ptr<io::Topology> topology_;
  std::unique_ptr<io::Device> device_;
  std::unique_ptr<Tiers> tiers_;
  std::unique_ptr<io::IoEngine> io_;
  std::unique_ptr<StagingRing> staging_;
  std::unique_ptr<Mover> mover_;
  std::unique_ptr<Trace> trace_;

  // Guards the tensor table, every tensor's state, this core's state below and every part's.
  // Moves run without it: a tensor being moved is busy instead, and only its own operations wait.
  // Lock order: mu_, then a TierSpace's lock, then the staging ring's; the engines' locks are
  // leaves. Nothing takes mu_ while holding one of those.
  Mutex mu_;
  CondVar changed_;
  TensorTable tensors_ ABSL_GUARDED_BY(runtime_lock);
  RoomToken room_ ABSL_GUARDED_BY(runtime_lock);
  FailureLog failures_ ABSL_GUARDED_BY(runtime_lock);
  DeferredFrees deferred_ ABSL_GUARDED_BY(runtime_lock);
  absl::flat_hash_map<uint64_t, uint32_t> wanted_in_hbm_ ABSL_GUARDED_BY(runtime_lock);
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
};

// Holds a core's lock for a scope, as MutexLock does a Mutex (the analysis: runtime_lock).
class ABSL_SCOPED_LOCKABLE CoreLock {
 public:
  explicit CoreLock(Core& core) ABSL_EXCLUSIVE_LOCK_FUNCTION(runtime_lock) : core_(core) {
    core_.Lock();
  }
  ~CoreLock() ABSL_UNLOCK_FUNCTION() { core_.Unlock(); }
  CoreLock(const CoreLock&) = delete;
  CoreLock& operator=(const CoreLock&) = delete;

 private:
  Core& core_;
};

}  // namespace tiermem
