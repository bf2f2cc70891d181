// The cheapest-window search and the eviction cost.
#include "lib/policy/eviction.h"

#include <algorithm>
#include <numeric>

namespace tiermem {

std::optional<EvictionWindow> CheapestWindow(const std::vector<EvictionSlot>& slots, uint64_t need,
                                             bool clean_first) {
  if (need == 0) return std::nullopt;
  std::optional<EvictionWindow> best;
  // The window [i, j]: no wall inside, its sums kept incrementally.
  size_t i = 0;
  uint64_t bytes = 0, evicted = 0, dirty = 0;
  double cost = 0;
  size_t victims = 0;
  auto drop_front = [&] {
    const EvictionSlot& s = slots[i++];
    bytes -= s.size;
    if (s.kind == EvictionSlot::Kind::kEvictable) {
      cost -= s.cost;
      evicted -= s.size;
      if (s.dirty) dirty -= s.size;
      --victims;
    }
  };
  for (size_t j = 0; j < slots.size(); ++j) {
    const EvictionSlot& s = slots[j];
    if (s.kind == EvictionSlot::Kind::kWall) {
      i = j + 1;
      bytes = evicted = dirty = 0;
      cost = 0;
      victims = 0;
      continue;
    }
    bytes += s.size;
    if (s.kind == EvictionSlot::Kind::kEvictable) {
      cost += s.cost;
      evicted += s.size;
      if (s.dirty) dirty += s.size;
      ++victims;
    }
    // The shortest window ending at j that still suffices is the cheapest ending at j.
    while (i < j && bytes - slots[i].size >= need) drop_front();
    if (bytes < need) continue;
    if (victims == 0) cost = 0;  // no rounding residue from the running sum
    const bool less_dirty = clean_first && best.has_value() && dirty < best->dirty_bytes;
    const bool as_dirty = !clean_first || !best.has_value() || dirty == best->dirty_bytes;
    const bool better =
        !best.has_value() || less_dirty ||
        (as_dirty && (cost < best->cost || (cost == best->cost && evicted < best->evicted_bytes)));
    if (better) best = EvictionWindow{i, j, cost, bytes, evicted, victims, dirty};
  }
  return best;
}

std::vector<size_t> CountedOrder(const std::vector<EvictionSlot>& slots, bool clean_first) {
  std::vector<size_t> order(slots.size());
  std::iota(order.begin(), order.end(), 0);
  auto rank = [&](size_t i) {
    switch (slots[i].kind) {
      case EvictionSlot::Kind::kFree:
        return 0;
      case EvictionSlot::Kind::kEvictable:
        return 1;
      default:
        return 2;
    }
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (rank(a) != 1) return false;
    const EvictionSlot& x = slots[a];
    const EvictionSlot& y = slots[b];
    if (clean_first && x.dirty != y.dirty) return !x.dirty;
    // Cost per byte, compared without dividing: x.cost / x.size < y.cost / y.size.
    const double lhs = x.cost * static_cast<double>(y.size);
    const double rhs = y.cost * static_cast<double>(x.size);
    if (lhs != rhs) return lhs < rhs;
    return x.size > y.size;
  });
  return order;
}

double EvictionCost(uint64_t bytes, bool dirty, uint64_t distance, uint64_t horizon) {
  double urgency = 1.0;
  if (distance != kNoNextUse) {
    urgency += static_cast<double>(horizon) / (static_cast<double>(distance) + 1.0);
  }
  return static_cast<double>(bytes) * (dirty ? 2.0 : 1.0) * urgency;
}

}  // namespace tiermem
