// HBM without adjacency: each copy gets an address range of its own in a large reserved range,
// backed by whichever physical chunks are free, wherever they lie. Any request that the free
// chunks cover is met: free memory split by copies in use (acquired by a caller, landing, being
// read) is still one pool, where a slab would need a hole of the copy's size. The HBM tier's
// TierSpace counts the budget in chunks; this arena finds the chunks and the addresses.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "io/device.h"
#include "io/sync.h"
#include "lib/tiers/offset_allocator.h"

namespace tiermem {

class MappedArena {
 public:
  // Address range per physical byte: the range fragments as copies come and go, and a request
  // fails on the range (not on memory) only when no hole of its size is left in it. Four times
  // the chunks leaves at least three times the budget in holes beside what is mapped.
  static constexpr uint64_t kRangeMultiple = 4;

  // `bytes` of the device's memory, rounded down to whole chunks; the device's error when it
  // cannot map memory in chunks (Unimplemented), `bytes` is below one (InvalidArgument), or it
  // is short.
  static absl::StatusOr<std::unique_ptr<MappedArena>> Create(io::Device& device, uint64_t bytes);
  // Unmaps what is still mapped (copies of tensors alive when the runtime goes).
  ~MappedArena();
  MappedArena(const MappedArena&) = delete;
  MappedArena& operator=(const MappedArena&) = delete;

  uint64_t chunk_bytes() const { return chunk_; }
  uint64_t capacity() const { return capacity_; }
  // Maps `bytes` (> 0, a multiple of chunk_bytes()) at an address of their own, the lowest free
  // chunks first. ResourceExhausted when the free chunks do not cover them, or no hole of the
  // range is large enough; nothing changes then.
  absl::StatusOr<void*> Allocate(uint64_t bytes);
  // Unmaps what Allocate returned; its chunks are free again.
  void Free(void* memory);
  // Chunks not mapped.
  uint64_t free_chunks() const;

 private:
  explicit MappedArena(std::unique_ptr<io::ChunkMapper> mapper);

  const std::unique_ptr<io::ChunkMapper> mapper_;
  const uint64_t chunk_;
  const uint64_t capacity_;
  mutable Mutex mu_;
  OffsetAllocator range_ ABSL_GUARDED_BY(mu_);
  // Free chunks, one bit each (set: free). A request takes the lowest free ones, so that chunks
  // side by side in the range tend to be side by side in memory.
  std::vector<uint64_t> free_ ABSL_GUARDED_BY(mu_);
  uint64_t free_count_ ABSL_GUARDED_BY(mu_) = 0;
  struct Mapping {
    uint32_t block = OffsetAllocator::kNone;  // in range_
    std::vector<uint64_t> chunks;
  };
  absl::flat_hash_map<const void*, Mapping> mappings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tiermem
