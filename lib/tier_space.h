// The byte budget of one tier: an offset allocator behind a lock, with usage counters.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
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

  // Reserves `bytes`. When full: TM_ERR_OUT_OF_MEMORY (HBM, DRAM) or TM_ERR_NO_SPACE (NVMe),
  // naming the tier, the tensor, what was asked and what is free.
  absl::StatusOr<Extent> Allocate(uint64_t bytes, absl::string_view tensor_name);
  // Frees and empties `e` (no-op when empty).
  void Free(Extent& e);

  tm_tier tier() const { return tier_; }
  uint64_t granule() const { return granule_; }
  tm_tier_stats Stats() const;

 private:
  const tm_tier tier_;
  const uint64_t granule_;  // fixed at construction: read without the lock
  mutable Mutex mu_;
  OffsetAllocator alloc_ ABSL_GUARDED_BY(mu_);
};

// Formats a byte count for messages: "64 MiB", "1.5 GiB", "4095 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace tiermem
