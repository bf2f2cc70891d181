// HBM memory handed on behind a copy down. An offload or an eviction's write-down frees its HBM
// copy once the copy to DRAM is done; the move waiting for that room (a prefetch of the next
// layer's weights, a demand) then crosses the link after it, and the two take the sum of their
// times though the link carries both directions at once. Instead the copy down goes in pieces,
// and once they are all enqueued the HBM copy is freed with each part fenced by the piece
// still reading it: a move up into that memory writes each of its pieces after the pieces down
// under it (a GPU runs the two on different copy engines, each piece ordered by an event), and
// every other writer of HBM waits for the fences first (Allocate).
//
// What a failure costs: the copy down is enqueued whole before anything is handed on, so a
// copy that cannot be enqueued leaves the tensor in HBM. A piece that fails once enqueued is a
// device error (CUDA's asynchronous errors are sticky: the context runs no more work), and the
// tensor's bytes, in memory handed on, are lost: the tensor says so when next used.
#include <algorithm>
#include <utility>
#include <vector>

#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

bool Room::MayVacate(const Tensor& t, tm_tier dst, Want want) {
  const TierSpace& hbm = core_.tiers()->space(TM_TIER_HBM);
  return want.vacates && core_.config().hbm_hand_on && dst == TM_TIER_DRAM &&
         core_.config().hbm_layout == HbmLayout::kSlab && !hbm.counted() &&
         t.copy(TM_TIER_HBM).state == CopyState::kValid && t.copy(TM_TIER_HBM).pins == 0;
}

void Room::OfferVacate(Tensor& t, MovePlan& plan, Want want, bool* vacated) {
  if (plan.src != TM_TIER_HBM || !MayVacate(t, plan.dst, want)) return;
  // Runs on this thread, inside the mover, without the runtime's lock (t is busy meanwhile).
  plan.on_vacate = [this, &t, vacated, src = plan.src_extent](std::vector<RangeFence> pieces)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS {
                         CoreLock lock(core_);
                         *vacated = Vacate(t, src, std::move(pieces));
                         return *vacated;
                       };
  plan.lands = want.lands;
}

bool Room::Vacate(Tensor& t, const Extent& extent, std::vector<RangeFence> pieces) {
  TensorCopy& c = t.copy(TM_TIER_HBM);
  if (c.state != CopyState::kValid || c.pins > 0 || c.extent.block != extent.block ||
      c.extent.offset != extent.offset || core_.WantedInHbm(t.handle)) {
    return false;
  }
  // The pieces start after the copy's uses (the move's `after`), each after the one before:
  // each piece's fence covers them.
  Extent e = t.Drop(TM_TIER_HBM);
  std::vector<io::FencePtr> fences;
  for (RangeFence& p : pieces) {
    p.offset += e.offset;
    fences.push_back(p.fence);
    vacating_.push_back(std::move(p));
  }
  ++counters_.handed_on;
  counters_.handed_on_bytes += t.bytes;
  // Kept out of the tier until the copy is done, unless a request finds no other hole
  // (MakeRoom): a move into free memory runs at once, one behind the copy waits for it.
  core_.DeferHandedOn(e, std::move(fences));
  prefetcher_.IssuePrefetches();
  core_.NotifyChanged();
  return true;
}

std::vector<RangeFence> Room::BehindFences(tm_tier tier, uint64_t offset, uint64_t size) {
  std::vector<RangeFence> behind;
  if (tier != TM_TIER_HBM || vacating_.empty()) return behind;
  std::erase_if(vacating_, [](const RangeFence& r) { return r.fence->Passed(); });
  for (const RangeFence& r : vacating_) {
    const uint64_t from = std::max(r.offset, offset);
    const uint64_t to = std::min(r.offset + r.size, offset + size);
    if (from < to) behind.push_back(RangeFence{from - offset, to - from, r.fence});
  }
  return behind;
}

void Room::WaitVacating() {
  for (const RangeFence& r : vacating_) (void)r.fence->Wait();
}

}  // namespace tiermem
