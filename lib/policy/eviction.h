// What to evict from a full tier: the cheapest window of address-adjacent blocks whose eviction
// leaves one hole big enough for a request. A pure function over the tier's layout, so that it
// is tested without a runtime.
//
// Why windows and not victims: a tier can have enough free bytes in total and still no hole
// that fits, because its free space lies between copies. Evicting by next use alone, one victim
// at a time, then empties the tier of evictable copies (each eviction frees a hole somewhere
// else) and still fails. Contiguity is the resource: the request needs `need` adjacent bytes,
// so the question is which run of neighbouring blocks (free ones cost nothing, pinned or moving
// ones are walls) is cheapest to clear. With non-negative costs the cheapest window ending at
// each block is the shortest one that still suffices, so one two-pointer pass finds the best
// window in O(blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace tiermem {

struct EvictionSlot {
  enum class Kind {
    kFree,       // a hole: costs nothing
    kEvictable,  // a copy that may go, at `cost`
    kWall,       // pinned, moving, the requester's own, or needed before a prefetch's use
  };
  uint64_t size = 0;  // bytes
  Kind kind = Kind::kFree;
  double cost = 0;     // kEvictable only; >= 0
  bool dirty = false;  // kEvictable only: the only copy, written down before it is freed
};

struct EvictionWindow {
  size_t first = 0, last = 0;  // slots [first, last], inclusive
  double cost = 0;             // sum of the evictable slots' costs
  uint64_t bytes = 0;          // the hole it leaves: sum of all slots' sizes
  uint64_t evicted_bytes = 0;  // sizes of its evictable slots
  size_t victims = 0;          // its evictable slots
  uint64_t dirty_bytes = 0;    // sizes of its dirty evictable slots
};

// The window of consecutive slots with no wall whose sizes add up to at least `need`, of least
// cost; among equal costs, the one evicting the fewest bytes, then the lowest address. nullopt
// when every run between walls is smaller than `need` (or `need` is 0).
// clean_first (a demand's room): windows are ranked by the bytes they must write down first
// (dirty_bytes), then by cost, so that a demand never waits for a write when dropping clean
// copies would have made the room. (Both are sums of non-negative terms over the window, so the
// shortest sufficient window ending at each slot is still the best one ending there.)
std::optional<EvictionWindow> CheapestWindow(const std::vector<EvictionSlot>& slots, uint64_t need,
                                             bool clean_first = false);

// An order of `slots` for a counted tier (lib/tiers/tier_space.h: memory per copy from an outside
// allocator, so there are no addresses to keep adjacent and any set of copies whose bytes
// suffice makes room): holes first, then the evictable copies cheapest per byte first (the
// larger first on a tie: fewer victims), walls last. CheapestWindow over slots taken in this
// order then finds a cheap set of victims as a window, and never fails for want of adjacency.
// Returns indices into `slots`. clean_first: clean evictable copies before dirty ones.
std::vector<size_t> CountedOrder(const std::vector<EvictionSlot>& slots, bool clean_first = false);

// The price of evicting one copy of `bytes`, used to rank windows:
//   bytes x (dirty ? 2 : 1) x urgency,  urgency = 1 + horizon / (distance + 1)
// - dirty: the only copy, which must be written one tier down before its space is free (twice
//   the traffic of dropping a clean copy, which is read back at most once);
// - distance: schedule positions until the copy's next use (kNoNextUse: never again, urgency
//   1), or, without a schedule, acquires since its last use (LRU's estimate);
// - horizon: the schedule's length (or the number of copies in the tier without one), so that a
//   copy needed next costs about horizon+1 times one needed a whole step away. For windows of
//   one victim of equal sizes this orders exactly as Belady (furthest next use first).
inline constexpr uint64_t kNoNextUse = UINT64_MAX;
double EvictionCost(uint64_t bytes, bool dirty, uint64_t distance, uint64_t horizon);

}  // namespace tiermem
