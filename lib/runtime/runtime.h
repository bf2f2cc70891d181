// The runtime: the device, the three tiers, the engines and the tensors, behind one C++ API
// that lib/c_api exposes as the C ABI. Runtime is the façade: it owns the shared core (core.h:
// the engines, the lock, the tensor table, the claim protocol) and the parts that work on it,
// wires them together, and runs the public operations (operations.cc, setup.cc,
// swap_contents.cc, and the entry points in each part's file). The parts, each with the state
// it owns in its header: Moves (moves.h), Room (room.h), Prefetcher (prefetcher.h), Movers
// (movers.h), CallerCopies (caller_copies.h), RecomputeCallbacks (recompute.h) and
// WriteThrough (write_through.h).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/runtime/caller_copies.h"
#include "lib/runtime/core.h"
#include "lib/runtime/move_jobs.h"
#include "lib/runtime/movers.h"
#include "lib/runtime/moves.h"
#include "lib/runtime/prefetcher.h"
#include "lib/runtime/recompute.h"
#include "lib/runtime/room.h"
#include "lib/runtime/write_through.h"
#include "tiermem/tiermem.h"

namespace tiermem {

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
  // for_export: the pin is a DLPack export's (tm_tensor_acquire_dlpack), released by
  // ReleaseExport only.
  // scheduled == false: a use the schedule does not learn (nor prefetch for when it replays):
  // the CPU Adam's pipeline, which reads its state ahead itself (the schedule's prefetches of it,
  // inside rt.step(), were evicted before use and read 7.6% of the state again a step).
  absl::StatusOr<void*> Acquire(uint64_t handle, tm_tier tier, tm_access access, void* stream,
                                bool for_export = false, bool scheduled = true);
  absl::Status Release(uint64_t handle, tm_tier tier);
  // Release once the work queued on `stream` so far has passed (an event; the host does not wait).
  absl::Status ReleaseOnStream(uint64_t handle, tm_tier tier, void* stream);
  // ReleaseOnStream of an acquire made for reading whose memory was written through its pointer:
  // in the same step, the copy becomes the tensor's only one, as an acquire for writing makes it
  // (tm_tensor_release_written).
  absl::Status ReleaseWritten(uint64_t handle, tm_tier tier, void* stream);
  // A DLPack export's deleter: its pin released (on `stream`, as ReleaseOnStream); an orphaned
  // tensor (destroyed while exports pinned it) is found too, and freed at its last export.
  absl::Status ReleaseExport(uint64_t handle, tm_tier tier, void* stream);
  // How many DLPack exports are out (not yet deleted), over every tensor.
  uint64_t ExportsOut();
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
  // it acquired or another step holds it; then, until UnholdForStep (from any thread: the step
  // unholds what it held, wherever it is committed), writes by other threads (tm_tensor_write,
  // copy_in, an acquire for writing) get TM_ERR_BUSY instead of being lost to the step's commit.
  absl::Status HoldForStep(uint64_t handle);
  void UnholdForStep(uint64_t handle);
  // The step holding the tensor (from this thread) is prepared and waits for its commit or
  // abort (tm_adam_step_groups_prepare): from now to UnholdForStep, this thread's writes,
  // holds and destroys of it are refused too.
  void SealForStep(uint64_t handle);
  absl::StatusOr<uint32_t> Residency(uint64_t handle);
  // Frees the tensor's copy in `tier` when a lower tier holds the same bytes and nobody holds or
  // moves it (a clean copy inclusive DRAM kept, or one read ahead): a caller streaming through
  // the tier says it will not read the copy again soon. A copy that is the only one, acquired,
  // or on its way is left alone: the call is a hint and succeeds.
  absl::Status DropCleanCopy(uint64_t handle, tm_tier tier);
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
  std::vector<TierSpace::Block> Layout(tm_tier tier) { return core_.tiers()->space(tier).Layout(); }
  // Bytes a tensor of `bytes` takes in `tier` (its granule); 0 when it exceeds the tier.
  uint64_t Rounded(tm_tier tier, uint64_t bytes) {
    return core_.tiers()->space(tier).Rounded(bytes);
  }
  const Config& config() const { return core_.config(); }
  const RuntimeInfo& info() const { return core_.info(); }
  // The HBM tier's backend, for tiermem-probe's copy measurements.
  io::Device& device() { return *core_.device(); }
  // The machine's topology (nullptr when hwloc could not load it), for binding host buffers
  // where the DRAM tier is (info().numa_node).
  const io::Topology* topology() const { return core_.topology(); }

 private:
  explicit Runtime(Config config) : core_(std::move(config)) {}
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
  // An acquire's use noted; the small prefetches up from DRAM its refill asks for started on
  // this thread (Moves::StartPrefetch), the rest queued for the movers.
  void NoteUseAndStart(Tensor& t, tm_tier tier, bool fill)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // ReleaseOnStream, and with `written` ReleaseWritten: one pin of the caller's dropped.
  absl::Status ReleaseCaller(uint64_t handle, tm_tier tier, void* stream, bool written);
  // One pin of t in tier dropped; `use`: the caller's stream's fence (or null), which tiermem
  // waits for before it touches the memory.
  void Unpin(Tensor& t, tm_tier tier, io::FencePtr use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // tm_tensor_destroy while only DLPack exports pin t (exports.cc): the handle is gone for
  // callers, the unpinned copies are freed, the pinned ones wait for the exports' deleters.
  void Orphan(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Every copy of t freed (a landing copy's memory once it has landed) and t taken out.
  void Free(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // ExportsOut's sum, for a caller holding the lock (Stats).
  uint64_t CountExports() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // The core first: the parts refer to it, and are destroyed before it.
  Core core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);  // the façade's own (acquires, hits)
  Moves moves_{core_, room_, prefetcher_, write_through_, recompute_};
  Room room_{core_, prefetcher_, jobs_, recompute_};
  MoveJobs jobs_{core_};
  Prefetcher prefetcher_{core_, jobs_};
  Movers movers_{core_, jobs_, moves_, prefetcher_};
  CallerCopies copies_{core_, moves_, prefetcher_, write_through_, recompute_};
  RecomputeCallbacks recompute_{core_};
  WriteThrough write_through_{core_, prefetcher_};
};

}  // namespace tiermem
