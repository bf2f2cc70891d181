// Compaction of HBM under fragmentation: when the free bytes are there but split by copies,
// copies nobody holds slide down into the hole before them, so that the holes merge. A
// device-to-device copy runs at HBM bandwidth (about fifty times the link's on an H200), where
// the alternative, evicting a copy and reading it back, crosses the link twice or is not
// allowed at all (a prefetch may not evict a copy used before the use it serves).
#include <algorithm>
#include <optional>
#include <vector>

#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

bool Room::Slidable(Tensor& v, tm_tier tier, uint64_t shift) {
  const TensorCopy& c = v.copy(tier);
  if (c.state != CopyState::kValid || c.pins > 0 || v.busy()) return false;
  if (v.landing.has_value() && v.landing_tier == tier) return false;
  if (!core_.PendingUses(v, tier).empty()) return false;  // a caller's stream may still read it
  // A copy down still reads the hole (vacate.cc): sliding now would overwrite its bytes.
  if (!BehindFences(tier, c.extent.offset - shift, shift).empty()) return false;
  // The copy runs in pieces no longer than the shift, lowest first, so no piece overwrites
  // bytes not yet copied. A failed piece would leave the bytes split between the old and the
  // new place: only a copy another tier also holds may take that risk (it is then dropped);
  // an only copy slides when the hole is at least its size, so its source stays whole.
  return !v.only_copy(tier) || shift >= c.extent.size;
}

bool Room::SlideDown(Tensor& v, tm_tier tier, uint64_t shift) {
  const Trace::Clock::time_point start = Trace::Clock::now();
  TensorCopy& c = v.copy(tier);
  char* src = core_.tiers()->Address(tier, c.extent);
  char* dst = src - shift;
  const uint64_t size = c.extent.size;
  const uint64_t piece = std::min(shift, size);
  for (uint64_t done = 0; done < size; done += piece) {
    const uint64_t n = std::min(piece, size - done);
    absl::Status s = core_.device()->copy_engine().Copy(io::CopyDirection::kDeviceToDevice,
                                                        dst + done, src + done, n);
    if (!s.ok()) {
      // Only a copy that another tier holds gets here with overlapping pieces: drop it there.
      if (done > 0 && !v.only_copy(tier)) core_.FreeCopy(v, tier);
      return false;
    }
  }
  std::optional<Extent> moved = core_.tiers()->space(tier).SlideDown(c.extent);
  if (!moved.has_value()) return false;  // the layout changed under us: cannot happen locked
  c.extent = *moved;
  ++counters_.relocations;
  counters_.relocation_bytes += v.bytes;
  core_.trace()->Add(Trace::kRelocation, v.name, start, Trace::Clock::now(), v.bytes);
  return true;
}

template <typename Slide>
bool Room::CompactionPass(tm_tier tier, uint64_t need, Slide&& slide) {
  TierSpace& space = core_.tiers()->space(tier);
  if (tier != TM_TIER_HBM || space.counted()) return false;  // DRAM holds pinned host buffers
  // One pass up the tier: each slide moves a hole up past a copy, where it merges with the
  // next hole, until a wall (a copy in use) stops it. Stops once a hole fits the request.
  const std::vector<TierSpace::Block> layout = space.Layout();
  uint64_t hole = 0;  // bytes of the free run just before the block looked at
  for (const TierSpace::Block& b : layout) {
    if (b.free) {
      hole += b.size;
      if (hole >= need) return true;
      continue;
    }
    Tensor* v = hole == 0 ? nullptr : core_.Lookup(b.owner);
    if (v == nullptr || !Slidable(*v, tier, hole) || !slide(*v, hole)) hole = 0;  // a wall
  }
  return false;
}

bool Room::Compact(tm_tier tier, uint64_t need) {
  bool slid = false;
  CompactionPass(tier, need, [&](Tensor& v, uint64_t shift) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!SlideDown(v, tier, shift)) return false;
    slid = true;
    return true;
  });
  return slid;
}

std::optional<uint64_t> Room::CompactionBytes(tm_tier tier, uint64_t need) {
  uint64_t bytes = 0;
  const bool formed = CompactionPass(tier, need, [&](Tensor& v, uint64_t) {  // moves nothing
    bytes += v.bytes;
    return true;
  });
  if (!formed) return std::nullopt;
  return bytes;
}

}  // namespace tiermem
