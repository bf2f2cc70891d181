// Setting up and tearing down the HBM slab (or its mapped chunks, or the framework's allocator)
// and the pinned DRAM region.
#include "lib/tiers/memory_tier.h"

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/tiers/mapped_arena.h"

namespace tiermem {

absl::StatusOr<std::unique_ptr<MemoryTier>> MemoryTier::CreateHbm(
    io::Device& device, uint64_t bytes, const DeviceAllocatorHooks& hooks, int device_ordinal,
    HbmLayout layout, absl::string_view budget_name) {
  if (bytes == 0) {
    return Error(TM_ERR_CONFIG, absl::StrFormat("%s resolves to 0 bytes", budget_name));
  }
  if (hooks.set()) {
    // No slab: the framework's allocator (a caching allocator) holds the GPU's memory, and
    // tiermem borrows from it copy by copy, within its budget. No stream is known where space
    // is reserved (a copy's memory may be first used by a mover), so the hooks get NULL: the
    // memory must be usable on any stream (see docs/c-api.md).
    TierBacking backing;
    backing.allocate = [hooks, device_ordinal](uint64_t n,
                                               absl::string_view tensor) -> absl::StatusOr<void*> {
      void* p = hooks.alloc(hooks.user, static_cast<size_t>(n), device_ordinal, nullptr);
      if (p == nullptr) {
        return Error(TM_ERR_OUT_OF_MEMORY,
                     absl::StrFormat("tm_config.device_alloc returned NULL for %llu bytes "
                                     "(tensor \"%s\")",
                                     static_cast<unsigned long long>(n), tensor));
      }
      return p;
    };
    backing.free = [hooks, device_ordinal](void* p, uint64_t n) {
      hooks.free(hooks.user, p, static_cast<size_t>(n), device_ordinal, nullptr);
    };
    return std::unique_ptr<MemoryTier>(
        new MemoryTier(TM_TIER_HBM, device, bytes, 256, std::move(backing)));
  }
  // More than the device has at all is a setting no run can meet (as a DRAM budget beyond what
  // an address space holds), not memory that others hold now.
  if (bytes > device.physical_bytes()) {
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("%s=%s is more than the device has (%s)", budget_name,
                                 HumanBytes(bytes), HumanBytes(device.physical_bytes())));
  }
  if (layout == HbmLayout::kMapped) return CreateMapped(device, bytes, budget_name);
  std::unique_ptr<MemoryTier> t(new MemoryTier(TM_TIER_HBM, device, bytes, 256));
  auto slab = device.AllocateSlab(bytes);
  if (!slab.ok()) {
    return Error(absl::IsResourceExhausted(slab.status()) ? TM_ERR_OUT_OF_MEMORY : TM_ERR_DEVICE,
                 absl::StrFormat("allocating the HBM tier (%s=%s): %s", budget_name,
                                 HumanBytes(bytes), slab.status().message()));
  }
  t->base_ = static_cast<char*>(*slab);
  t->slab_bytes_ = bytes;
  t->mapped_ = bytes;
  return t;
}

absl::StatusOr<std::unique_ptr<MemoryTier>> MemoryTier::CreateMapped(
    io::Device& device, uint64_t bytes, absl::string_view budget_name) {
  auto arena = MappedArena::Create(device, bytes);
  if (!arena.ok()) {
    const absl::Status& s = arena.status();
    tm_status code = absl::IsResourceExhausted(s)                             ? TM_ERR_OUT_OF_MEMORY
                     : absl::IsUnimplemented(s) || absl::IsInvalidArgument(s) ? TM_ERR_CONFIG
                                                                              : TM_ERR_DEVICE;
    return Error(code, absl::StrFormat("TIERMEM_HBM_LAYOUT=mapped (%s=%llu): %s", budget_name,
                                       static_cast<unsigned long long>(bytes), s.message()));
  }
  // Owned by the backing's two functions: the space frees its last extents into it.
  std::shared_ptr<MappedArena> a = std::move(*arena);
  TierBacking backing;
  backing.allocate = [a](uint64_t n, absl::string_view tensor) -> absl::StatusOr<void*> {
    auto p = a->Allocate(n);
    if (!p.ok()) {
      return Error(TM_ERR_OUT_OF_MEMORY,
                   absl::StrFormat("tensor \"%s\": %s", tensor, p.status().message()));
    }
    return *p;
  };
  backing.free = [a](void* p, uint64_t) { a->Free(p); };
  return std::unique_ptr<MemoryTier>(
      new MemoryTier(TM_TIER_HBM, device, a->capacity(), a->chunk_bytes(), std::move(backing)));
}

absl::StatusOr<std::unique_ptr<MemoryTier>> MemoryTier::CreateDram(
    io::Device& device, const io::Topology* topo, uint64_t bytes, int numa_node, uint64_t granule,
    uint64_t reserved, absl::string_view budget_name) {
  if (bytes == 0)
    return Error(TM_ERR_CONFIG, absl::StrFormat("%s resolves to 0 bytes", budget_name));
  if (reserved >= bytes || (bytes - reserved) / granule == 0) {
    return Error(
        TM_ERR_CONFIG,
        absl::StrFormat("%s=%s leaves no room beside the %s staging pool (the tier needs "
                        "one granule, %s, at least)",
                        budget_name, HumanBytes(bytes), HumanBytes(reserved), HumanBytes(granule)));
  }
  std::unique_ptr<MemoryTier> t(
      new MemoryTier(TM_TIER_DRAM, device, (bytes - reserved) / granule * granule, granule));
  auto region = io::HostRegion::Create(bytes, topo, numa_node);
  if (!region.ok()) {
    tm_status code =
        absl::IsInvalidArgument(region.status()) ? TM_ERR_CONFIG : TM_ERR_OUT_OF_MEMORY;
    return Error(code,
                 absl::StrFormat("%s=%llu: %s", budget_name, static_cast<unsigned long long>(bytes),
                                 region.status().message()));
  }
  t->host_ = std::move(*region);
  t->base_ = static_cast<char*>(t->host_->data());
  t->mapped_ = t->host_->size();
  t->reserved_ = reserved;
  t->numa_node_ = numa_node;
  // Pinned once, at start-up and whole: registration is slow and must stay off the hot path.
  if (auto s = device.RegisterHost(t->base_, t->host_->size()); !s.ok()) {
    return Error(TM_ERR_DEVICE, absl::StrFormat("pinning the DRAM tier (%s) for the device: %s",
                                                HumanBytes(bytes), s.message()));
  }
  t->registered_ = true;
  return t;
}

MemoryTier::~MemoryTier() {
  if (registered_) device_.UnregisterHost(base_);
  if (slab_bytes_ > 0) device_.FreeSlab(base_, slab_bytes_);
}

}  // namespace tiermem
