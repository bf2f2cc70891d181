// The runtime: the device, the three tiers, the engines and the tensors, behind one C++ API
// that lib/c_api exposes as the C ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "io/sync.h"
#include "io/device.h"
#include "io/io_engine.h"
#include "io/numa.h"
#include "lib/config.h"
#include "lib/memory_tier.h"
#include "lib/mover.h"
#include "lib/nvme_tier.h"
#include "lib/schedule.h"
#include "lib/staging_pool.h"
#include "lib/trace.h"
#include "lib/tensor.h"
#include "tiermem/tiermem.h"

namespace tiermem {

struct TensorDesc {
  uint64_t bytes = 0;
  tm_tensor_class cls = TM_CLASS_OTHER;
  int home_tier = TM_TIER_BY_PLACEMENT;
  std::string name;
};

// What the runtime found when it set itself up, for tiermem-probe and logs.
struct RuntimeInfo {
  std::string device;       // Device::Describe()
  std::string device_kind;  // "cuda" | "emulated"
  std::string no_gpu;       // with the emulated device: why no GPU is used
  int numa_node = -1;       // node the DRAM tier is bound to, -1 when unbound
  int numa_nodes = 1;
  std::string io_engine;    // "uring" | "posix"
  bool io_buffers_registered = false;
  bool io_files_registered = false;
  uint64_t staging_chunk = 0;  // bytes per staging slot
  uint32_t staging_slots = 0;
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
  absl::Status Write(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes);
  absl::Status Read(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes);
  absl::StatusOr<void*> Acquire(uint64_t handle, tm_tier tier, tm_access access, void* stream);
  absl::Status Release(uint64_t handle, tm_tier tier);
  // Asynchronous: queued, and return at once. Failures are reported by Sync / SyncAll.
  absl::Status Prefetch(uint64_t handle, tm_tier tier);
  absl::Status Offload(uint64_t handle, tm_tier tier);
  // Waits for the tensor's queued and running moves; returns (and forgets) the first failure.
  absl::Status Sync(uint64_t handle);
  // Waits for every queued and running move; returns (and forgets) the failures.
  absl::Status SyncAll();
  absl::StatusOr<uint32_t> Residency(uint64_t handle);
  // Steps and the schedule (see Schedule).
  absl::Status StepBegin();
  absl::Status StepEnd();
  absl::Status SetSchedule(const std::vector<Schedule::Use>& uses);

  tm_stats Stats();
  const Config& config() const { return config_; }
  const RuntimeInfo& info() const { return info_; }
  // The HBM tier's backend, for tiermem-probe's copy measurements.
  io::Device& device() { return *device_; }

 private:
  explicit Runtime(Config config) : config_(std::move(config)) {}
  absl::Status Init();
  // The tensor of `handle`, or TM_ERR_INVALID_HANDLE.
  absl::StatusOr<Tensor*> Find(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tensor of `handle` once no move of it runs and its stream-ordered copy (if any) is
  // done: the caller may then change it. May release and retake the lock while waiting.
  absl::StatusOr<Tensor*> Claim(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `f` without the lock while the tensor is marked busy.
  template <typename F>
  absl::Status Unlocked(Tensor& t, F&& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes t's copy in `dst` valid (a claimed tensor). Releases the lock during the move, and
  // while evicting to make room. `horizon`: for a prefetch, the schedule position it serves
  // (only tensors needed later may be evicted for it); kDemand for a demand move.
  static constexpr uint64_t kDemand = Schedule::kNever;
  absl::Status MakeValid(Tensor& t, tm_tier dst, void* stream = nullptr,
                         uint64_t horizon = kDemand) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Space for t (busy) in `tier`, evicting other tensors' copies when the tier is full.
  absl::StatusOr<Extent> Allocate(Tensor& t, tm_tier tier, uint64_t horizon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves t's copy in `tier` and declares it valid unfilled (a whole overwrite follows).
  absl::Status Reserve(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy in `tier` to evict: unpinned, not moving, next used furthest away (Belady) with a
  // schedule, least recently used without; nullptr when none may go.
  Tensor* PickVictim(tm_tier tier, const Tensor* requester, uint64_t horizon)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees v's copy in `tier`: dropped when another copy is valid, written down first if not.
  absl::Status Evict(Tensor& v, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues prefetches for the scheduled uses ahead of the current position.
  void IssuePrefetches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a claimed tensor down to `tier` and frees the copies above.
  absl::Status OffloadClaimed(Tensor& t, tm_tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TM_ERR_BUSY when a copy other than `keep` is pinned (it would have to be freed).
  absl::Status CheckOthersUnpinned(const Tensor& t, int keep) const;
  // TM_ERR_BUSY when a copy above `tier` is pinned.
  absl::Status CheckAboveUnpinned(const Tensor& t, tm_tier tier) const;
  // Frees every copy except the one in `keep`: they became stale.
  void DropOthers(Tensor& t, tm_tier keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues an asynchronous move.
  absl::Status Enqueue(uint64_t handle, tm_tier tier, bool offload);
  tm_tier HomeOf(tm_tensor_class cls) const;
  // A mover thread: runs queued moves until the runtime stops.
  void MoverLoop();

  Config config_;
  RuntimeInfo info_;
  std::unique_ptr<io::Topology> topology_;
  std::unique_ptr<io::Device> device_;
  std::unique_ptr<MemoryTier> hbm_;
  std::unique_ptr<MemoryTier> dram_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<io::IoEngine> io_;
  std::unique_ptr<StagingPool> staging_;
  std::unique_ptr<Mover> mover_;

  // Guards the tensor table, every tensor's state and the job queue. Moves run without it: a
  // tensor being moved is marked busy instead, and only its own operations wait.
  Mutex mu_;
  CondVar changed_;  // a tensor stopped being busy, or a job finished
  CondVar work_;     // a job was queued, or the runtime stops
  TensorTable tensors_ ABSL_GUARDED_BY(mu_);
  struct Job {
    uint64_t handle;
    tm_tier tier;
    bool offload;
    uint64_t horizon = kDemand;    // a scheduled prefetch: the position it serves
    uint64_t prefetch_bytes = 0;   // counted in prefetch_in_flight_ until done
  };
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // jobs queued or running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Schedule schedule_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prefetch_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // bytes
  uint64_t prefetch_limit_ = 0;                           // bytes
  struct Counters {
    uint64_t acquires = 0, hits = 0, misses = 0, stall_ns = 0, prefetches = 0, evictions = 0,
             eviction_bytes = 0;
  } counters_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Trace> trace_;
  std::vector<std::thread> movers_;
};

}  // namespace tiermem
