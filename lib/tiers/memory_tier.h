// An addressable tier: HBM (one device slab, or each copy from the framework's allocator) or
// pinned DRAM (one NUMA-bound host region), sub-allocated by a TierSpace.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/device.h"
#include "io/host_memory.h"
#include "io/numa.h"
#include "lib/config/config.h"
#include "lib/tiers/tier_space.h"

namespace tiermem {

class MemoryTier {
 public:
  // `bytes` of device memory laid out as `layout` says: a slab sub-allocated by offset, or chunks
  // mapped copy by copy (a MappedArena: a counted TierSpace whose granule is the chunk). When
  // `hooks` are set, the layout does not apply: each copy's memory
  // comes from hooks.alloc (with `device_ordinal`: the CUDA ordinal, -1 for the emulated
  // device) and goes back with hooks.free, `bytes` staying the budget (a counted TierSpace).
  // `budget_name` names the budget in messages: where it was set (Config::SettingName).
  static absl::StatusOr<std::unique_ptr<MemoryTier>> CreateHbm(
      io::Device& device, uint64_t bytes, const DeviceAllocatorHooks& hooks = {},
      int device_ordinal = -1, HbmLayout layout = HbmLayout::kSlab,
      absl::string_view budget_name = "TIERMEM_HBM_BYTES");
  // `bytes` of host memory bound to `numa_node` (-1: unbound), pinned with the device.
  // `granule` is the O_DIRECT alignment that every copy must keep. The last `reserved` bytes
  // are not sub-allocated: they are the staging pool's (see reserved()). `budget_name` as for
  // CreateHbm.
  static absl::StatusOr<std::unique_ptr<MemoryTier>> CreateDram(
      io::Device& device, const io::Topology* topo, uint64_t bytes, int numa_node, uint64_t granule,
      uint64_t reserved, absl::string_view budget_name = "TIERMEM_DRAM_BYTES");
  ~MemoryTier();
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  TierSpace& space() { return space_; }
  const TierSpace& space() const { return space_; }
  char* Address(const Extent& e) const {
    return e.memory != nullptr ? static_cast<char*>(e.memory) : base_ + e.offset;
  }
  // The whole mapped range, reserved tail included (for registering with the I/O engine); null
  // for HBM from the framework's allocator.
  char* base() const { return base_; }
  uint64_t mapped_bytes() const { return mapped_; }
  // The reserved tail.
  char* reserved() const { return base_ + mapped_ - reserved_; }
  int numa_node() const { return numa_node_; }

 private:
  static absl::StatusOr<std::unique_ptr<MemoryTier>> CreateMapped(io::Device& device,
                                                                  uint64_t bytes,
                                                                  absl::string_view budget_name);
  MemoryTier(tm_tier tier, io::Device& device, uint64_t capacity, uint64_t granule)
      : device_(device), space_(tier, capacity, granule) {}
  MemoryTier(tm_tier tier, io::Device& device, uint64_t capacity, uint64_t granule,
             TierBacking backing)
      : device_(device), space_(tier, capacity, granule, std::move(backing)) {}

  io::Device& device_;
  TierSpace space_;
  char* base_ = nullptr;
  uint64_t mapped_ = 0;                   // bytes at base_
  uint64_t reserved_ = 0;                 // DRAM: the staging tail
  uint64_t slab_bytes_ = 0;               // HBM: the device slab
  std::unique_ptr<io::HostRegion> host_;  // DRAM: the host region
  bool registered_ = false;
  int numa_node_ = -1;
};

}  // namespace tiermem
