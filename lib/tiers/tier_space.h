// The byte budget of one tier: an offset allocator behind a lock, with usage counters; or, for a
// tier whose memory comes per copy from an outside allocator, a byte count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/sync.h"
#include "lib/base/status.h"
#include "lib/tiers/offset_allocator.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// A reserved range of a tier. Empty when block == kNone.
struct Extent {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t block = OffsetAllocator::kNone;
  // With a backing (see TierBacking): the memory the backing gave this extent. Carried in the
  // extent so that finding its address needs no lookup and no lock.
  void* memory = nullptr;
  bool empty() const { return block == OffsetAllocator::kNone; }
};

// Memory per extent from an outside allocator (the framework's device allocator for HBM),
// instead of offsets into one range that the tier mapped itself.
struct TierBacking {
  // Memory for an extent of `bytes` for the tensor `tensor_name`; an error naming the
  // allocator when it has none (TierSpace marks it: see IsBackingShort).
  std::function<absl::StatusOr<void*>(uint64_t bytes, absl::string_view tensor_name)> allocate;
  // Gives back what allocate returned, with the same byte count.
  std::function<void(void* memory, uint64_t bytes)> free;
};

// Whether `s` is a TierSpace::Allocate failure of the backing (the budget had room): making
// room in the budget cannot help, only giving memory back to the backing's allocator can.
bool IsBackingShort(const absl::Status& s);

class TierSpace {
 public:
  TierSpace(tm_tier tier, uint64_t capacity, uint64_t granule)
      : tier_(tier), granule_(granule), alloc_(capacity, granule) {}
  // A counted space: each extent's memory comes from `backing`, and the space only counts
  // bytes against `capacity` (rounded to the granule). Any request that fits in the free
  // bytes succeeds, as far as the budget goes: there are no addresses, so no fragmentation.
  TierSpace(tm_tier tier, uint64_t capacity, uint64_t granule, TierBacking backing)
      : tier_(tier), granule_(granule), backing_(std::move(backing)), alloc_(capacity, granule) {}
  // A counted space gives back the memory of every extent still reserved.
  ~TierSpace();
  TierSpace(const TierSpace&) = delete;
  TierSpace& operator=(const TierSpace&) = delete;

  // Reserves `bytes` for the tensor `owner` (a handle; 0 for none). When full:
  // TM_ERR_OUT_OF_MEMORY (HBM, DRAM) or TM_ERR_NO_SPACE (NVMe), naming the tier, the tensor,
  // what was asked and what is free. A counted space then asks its backing for the extent's
  // memory; when the backing has none, the backing's error (TM_ERR_OUT_OF_MEMORY, marked for
  // IsBackingShort) and nothing is reserved.
  absl::StatusOr<Extent> Allocate(uint64_t bytes, absl::string_view tensor_name,
                                  uint64_t owner = 0);
  // The same, placed by its neighbours: `frees_after(owner)` tells how soon a reserved block's
  // memory is likely to be free again (lower is sooner; owner 0 is a deferred free). A request
  // smaller than the hole it gets takes the end away from the neighbour that frees sooner, so
  // that the leftover and that neighbour can later be one window for eviction; the ends of the
  // tier never free. (A counted space has no addresses: the same as the plain Allocate.)
  // `frees_after` runs under this space's lock: it must not call back into the space.
  using FreesAfter = absl::FunctionRef<uint64_t(uint64_t owner)>;
  absl::StatusOr<Extent> Allocate(uint64_t bytes, absl::string_view tensor_name, uint64_t owner,
                                  FreesAfter frees_after);
  // Frees and empties `e` (no-op when empty). A counted space gives the memory back to its
  // backing before the bytes are counted free, so the backing never holds more than capacity.
  void Free(Extent& e);
  // Keeps `e` reserved but owned by no tensor: its tensor dropped it while callers' work may
  // still use the memory (a deferred free); eviction sees a wall.
  void Disown(const Extent& e);
  // Compaction: moves `e` down to the start of the free block before it (the caller has
  // copied its bytes there) and returns it at its new offset; nullopt when the block before is
  // reserved, or for a counted space (no addresses).
  std::optional<Extent> SlideDown(const Extent& e);
  // Hands `e` to the tensor `owner` (tensors that swap contents: Runtime::SwapContents).
  void Reown(const Extent& e, uint64_t owner);
  // True for a counted space (a backing): Layout's order then means nothing, and any set of
  // copies whose bytes suffice makes room (see CountedOrder in lib/policy/eviction.h).
  bool counted() const { return static_cast<bool>(backing_.allocate); }
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
  // Every block in address order: what eviction looks at to find a contiguous window. A
  // counted space lists its reserved blocks (offsets made up, consecutive), then its free bytes
  // as one block.
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
  absl::StatusOr<Extent> AllocatePlaced(uint64_t bytes, absl::string_view tensor_name,
                                        uint64_t owner, const FreesAfter* frees_after);
  absl::StatusOr<Extent> AllocateCounted(uint64_t bytes, absl::string_view tensor_name,
                                         uint64_t owner);
  // The error of a request of `bytes` that does not fit.
  absl::Status Full(uint64_t bytes, absl::string_view tensor_name, uint64_t free,
                    uint64_t largest) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const tm_tier tier_;
  const uint64_t granule_;  // fixed at construction: read without the lock
  std::function<void(const Extent&)> on_free_;
  const TierBacking backing_;  // set at construction: read without the lock
  mutable Mutex mu_;
  OffsetAllocator alloc_ ABSL_GUARDED_BY(mu_);         // unused by a counted space
  std::vector<uint64_t> owners_ ABSL_GUARDED_BY(mu_);  // by allocator block index
  // A counted space: its reserved extents by block index (empty slots have size 0), the
  // indices free for reuse, and the bytes reserved now and at most.
  struct Counted {
    uint64_t size = 0;
    uint64_t owner = 0;
    void* memory = nullptr;  // null while the backing is being asked
  };
  std::vector<Counted> counted_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> spare_ ABSL_GUARDED_BY(mu_);
  uint64_t counted_used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t counted_peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tiermem
