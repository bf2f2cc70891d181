// The byte budget of one tier: an offset allocator behind a lock, with usage counters.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/sync.h"
#include "lib/offset_allocator.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// A reserved range of a tier. Empty when block == kNone.
struct Extent {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t block = OffsetAllocator::kNone;
  bool empty() const { return block == OffsetAllocator::kNone; }
};

class TierSpace {
 public:
  TierSpace(tm_tier tier, uint64_t capacity, uint64_t granule)
      : tier_(tier), granule_(granule), alloc_(capacity, granule) {}

  // Reserves `bytes` for the tensor `owner` (a handle; 0 for none). When full:
  // TM_ERR_OUT_OF_MEMORY (HBM, DRAM) or TM_ERR_NO_SPACE (NVMe), naming the tier, the tensor,
  // what was asked and what is free.
  absl::StatusOr<Extent> Allocate(uint64_t bytes, absl::string_view tensor_name,
                                  uint64_t owner = 0);
  // Frees and empties `e` (no-op when empty).
  void Free(Extent& e);
  // Keeps `e` reserved but owned by no tensor: its tensor dropped it while callers' work may
  // still use the memory (a deferred free); eviction sees a wall.
  void Disown(const Extent& e);
  // Called with each extent about to be freed, before its space can be handed out again (the
  // NVMe tier drops the extent's checksums). Set once, before the tier is used.
  void set_on_free(std::function<void(const Extent&)> f) { on_free_ = std::move(f); }

  // A block of the tier in address order: free (owner 0, free true) or reserved by `owner`.
  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t owner = 0;
    bool free = false;
  };
  // Every block in address order: what eviction looks at to find a contiguous window.
  std::vector<Block> Layout() const;
  // Bytes a request of `bytes` takes in this tier (rounded to the granule); 0 when it could not
  // fit in the whole capacity.
  uint64_t Rounded(uint64_t bytes) const;
  uint64_t capacity() const;
  uint64_t free_bytes() const;

  tm_tier tier() const { return tier_; }
  uint64_t granule() const { return granule_; }
  tm_tier_stats Stats() const;

 private:
  const tm_tier tier_;
  const uint64_t granule_;  // fixed at construction: read without the lock
  std::function<void(const Extent&)> on_free_;
  mutable Mutex mu_;
  OffsetAllocator alloc_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> owners_ ABSL_GUARDED_BY(mu_);  // by allocator block index
};

// Formats a byte count for messages: "64 MiB", "1.5 GiB", "4095 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace tiermem
