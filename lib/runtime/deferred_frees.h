// Extents whose tensor dropped them while callers' work may still use the memory: freed once
// their fences pass (as PyTorch's allocator frees a block only after record_stream's events).
// Guarded by the runtime's lock.
#pragma once

#include <vector>

#include "io/copy_engine.h"
#include "lib/tiers/tiers.h"

namespace tiermem {

class DeferredFrees {
 public:
  // Takes e out of its tier's accounting until `uses` have passed.
  // `handed_on`: memory a copy down still reads (lib/runtime/vacate.cc), which a request that
  // finds no other hole may take at once (ReleaseHandedOn) and write behind the copy's fences.
  void Add(Tiers& tiers, tm_tier tier, const Extent& e, std::vector<io::FencePtr> uses,
           bool handed_on = false) {
    tiers.space(tier).Disown(e);
    deferred_.push_back(Deferred{tier, e, std::move(uses), handed_on});
  }
  // Frees the handed-on extents of `tier` now; true when there were any.
  bool ReleaseHandedOn(Tiers& tiers, tm_tier tier);
  // For a request that found no hole: Reap, then ReleaseHandedOn.
  void ReapForRoom(Tiers& tiers, tm_tier tier) {
    Reap(tiers, tier);
    ReleaseHandedOn(tiers, tier);
  }
  // Whether the deferred extent at `offset` of `tier` is handed on: room, for eviction's plans.
  bool HandedOnAt(tm_tier tier, uint64_t offset) const {
    for (const Deferred& d : deferred_) {
      if (d.handed_on && d.tier == tier && d.extent.offset == offset) return true;
    }
    return false;
  }
  // Frees the extents whose uses have passed; true when any of `tier` remain.
  bool Reap(Tiers& tiers, tm_tier tier);
  void ReapAll(Tiers& tiers) {
    for (int tier = 0; tier < TM_TIER_COUNT; ++tier) Reap(tiers, static_cast<tm_tier>(tier));
  }
  // The fences still pending, for a sync that waits for them (then ReapAll).
  std::vector<io::FencePtr> Fences() const;
  bool empty() const { return deferred_.empty(); }

 private:
  struct Deferred {
    tm_tier tier;
    Extent extent;
    std::vector<io::FencePtr> uses;
    bool handed_on = false;
  };
  std::vector<Deferred> deferred_;
};

}  // namespace tiermem
