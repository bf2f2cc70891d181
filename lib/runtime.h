// The runtime: the device, the three tiers, the engines and the tensors, behind one C++ API
// that lib/c_api exposes as the C ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "io/device.h"
#include "io/io_engine.h"
#include "io/numa.h"
#include "lib/config.h"
#include "lib/memory_tier.h"
#include "lib/mover.h"
#include "lib/nvme_tier.h"
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
  int numa_node = -1;       // node the DRAM tier is bound to, -1 when unbound
  int numa_nodes = 1;
  std::string io_engine;    // "uring" | "posix"
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
  absl::Status Offload(uint64_t handle, tm_tier tier);
  absl::StatusOr<uint32_t> Residency(uint64_t handle);

  tm_stats Stats();
  const Config& config() const { return config_; }
  const RuntimeInfo& info() const { return info_; }

 private:
  explicit Runtime(Config config) : config_(std::move(config)) {}
  absl::Status Init();
  // The tensor of `handle`, or TM_ERR_INVALID_HANDLE.
  absl::StatusOr<Tensor*> Find(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TM_ERR_BUSY when a copy other than `keep` is pinned (it would have to be freed).
  absl::Status CheckOthersUnpinned(const Tensor& t, int keep) const;
  // Frees every copy except the one in `keep`: they became stale.
  void DropOthers(Tensor& t, tm_tier keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Config config_;
  RuntimeInfo info_;
  std::unique_ptr<io::Topology> topology_;
  std::unique_ptr<io::Device> device_;
  std::unique_ptr<MemoryTier> hbm_;
  std::unique_ptr<MemoryTier> dram_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<io::IoEngine> io_;
  std::unique_ptr<Mover> mover_;

  // Guards the tensor table and every tensor's state. Moves run under it in this version, so
  // calls are serialized; the engines below have their own locks.
  absl::Mutex mu_;
  TensorTable tensors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tiermem
