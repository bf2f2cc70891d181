// The three tiers together: their spaces (budgets and allocators) and their addresses. The
// runtime reserves and frees space through it; the mover only moves bytes between addresses
// and extents that the runtime chose.
#pragma once

#include <memory>

#include "lib/tiers/memory_tier.h"
#include "lib/tiers/nvme_tier.h"
#include "lib/tiers/tier_space.h"
#include "tiermem/tiermem.h"

namespace tiermem {

class Tiers {
 public:
  Tiers(std::unique_ptr<MemoryTier> hbm, std::unique_ptr<MemoryTier> dram,
        std::unique_ptr<NvmeTier> nvme)
      : hbm_(std::move(hbm)), dram_(std::move(dram)), nvme_(std::move(nvme)) {}

  TierSpace& space(tm_tier tier) {
    switch (tier) {
      case TM_TIER_HBM:
        return hbm_->space();
      case TM_TIER_DRAM:
        return dram_->space();
      default:
        return nvme_->space();
    }
  }
  // The address of an extent of HBM (a device pointer with CUDA) or DRAM.
  char* Address(tm_tier tier, const Extent& e) const {
    return (tier == TM_TIER_HBM ? *hbm_ : *dram_).Address(e);
  }
  MemoryTier& hbm() { return *hbm_; }
  MemoryTier& dram() { return *dram_; }
  NvmeTier& nvme() { return *nvme_; }

 private:
  // Declared in the order they are torn down last-first: the DRAM region outlives nothing
  // that reads it.
  std::unique_ptr<MemoryTier> hbm_;
  std::unique_ptr<MemoryTier> dram_;
  std::unique_ptr<NvmeTier> nvme_;
};

}  // namespace tiermem
