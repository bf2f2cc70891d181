// A TLSF-style (two-level segregated fit) allocator of offsets in [0, capacity): O(1) allocate and
// free, alignment, immediate coalescing, metadata kept outside the managed range (HBM and NVMe
// are not addressable by the CPU). Not thread-safe: the owning tier locks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tiermem {

class OffsetAllocator {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Allocation {
    uint64_t offset = 0;     // bytes from the start of the range, aligned as requested
    uint64_t size = 0;       // bytes reserved, a multiple of the granule
    uint32_t block = kNone;  // handle to pass to Free
  };

  // `granule` (a power of two) is the unit of every offset and size: 4096 keeps O_DIRECT happy.
  OffsetAllocator(uint64_t capacity, uint64_t granule);

  // Reserves at least `bytes` (> 0) at an offset that is a multiple of `alignment` (a power of
  // two; 0 means the granule). nullopt only when no free block can hold the request: the O(1)
  // good-fit search (one size class up) comes first, then the request's own class is walked, so
  // that a hole which fits is always found (eviction relies on it: the window it frees must be
  // usable).
  std::optional<Allocation> Allocate(uint64_t bytes, uint64_t alignment = 0);

  // Which end of the free block it found a request takes when the block is larger than the
  // request: kFront leaves the leftover after it, kBack before it. The chooser is given the
  // block's physical neighbours (handles as Allocate returns them; kNone at the range's ends),
  // so that a caller who knows which neighbour will be freed first can keep the leftover next
  // to it, where the two can later merge into one hole (tiermem's eviction window).
  enum class Side { kFront, kBack };
  using SideChooser = absl::FunctionRef<Side(uint32_t prev, uint32_t next)>;
  std::optional<Allocation> Allocate(uint64_t bytes, uint64_t alignment, SideChooser side);

  // A block in address order, as ForEachBlock reports it.
  struct Span {
    uint64_t offset = 0;  // bytes
    uint64_t size = 0;    // bytes
    uint32_t block = kNone;
    bool free = false;
  };
  // Calls f(const Span&) for every block, free or not, in address order.
  template <typename F>
  void ForEachBlock(F&& f) const {
    for (uint32_t b = first_; b != kNone; b = blocks_[b].next_phys) {
      const Block& blk = blocks_[b];
      f(Span{blk.offset * granule_, blk.size * granule_, b, blk.free});
    }
  }
  // Bytes that a request of `bytes` takes once rounded to the granule (0 when it cannot be
  // represented).
  uint64_t Rounded(uint64_t bytes) const {
    const uint64_t n = bytes / granule_ + (bytes % granule_ != 0);
    return n > capacity_ / granule_ ? 0 : n * granule_;
  }

  // Returns a block. The handle must come from Allocate and not have been freed.
  void Free(uint32_t block);

  // Moves the reserved `block` down to the start of the free block before it, whose bytes then
  // follow it (merged with a free block after it): compaction. The caller copies the block's
  // bytes first. Returns the new offset in bytes; nullopt when the block before is reserved
  // or there is none.
  std::optional<uint64_t> SlideDown(uint32_t block);

  uint64_t capacity() const { return capacity_; }
  uint64_t granule() const { return granule_; }
  uint64_t used() const { return used_ * granule_; }
  uint64_t peak() const { return peak_ * granule_; }
  // Size of the largest free block, in bytes (walks one size class: for messages and tests).
  uint64_t LargestFree() const;
  // Smallest request size (in bytes) that Allocate rounds `bytes` up to when searching;
  // nullopt when that size does not fit in 64 bits.
  std::optional<uint64_t> SearchSize(uint64_t bytes) const;

 private:
  static constexpr int kSlBits = 4;
  static constexpr uint32_t kSlCount = 1u << kSlBits;
  static constexpr int kFlCount = 64;

  // A run of granules. Physical neighbours link every block in offset order; free blocks are
  // also on the list of their size class. Invariant: two free blocks are never neighbours.
  struct Block {
    uint64_t offset = 0;  // granules
    uint64_t size = 0;    // granules
    uint32_t prev_phys = kNone, next_phys = kNone;
    uint32_t prev_free = kNone, next_free = kNone;
    bool free = false;
  };

  std::optional<Allocation> AllocateAt(uint64_t bytes, uint64_t alignment, const SideChooser* side);
  static void Mapping(uint64_t n, uint32_t& fl, uint32_t& sl);
  uint32_t NewBlock();
  void ReleaseBlock(uint32_t b);
  void InsertFree(uint32_t b);
  void RemoveFree(uint32_t b);
  // First free block of size class >= (fl, sl), or kNone.
  uint32_t FindFree(uint32_t fl, uint32_t sl) const;
  // A free block of class (fl, sl) that holds `n` granules aligned to `align`, or kNone.
  uint32_t WalkClass(uint32_t fl, uint32_t sl, uint64_t n, uint64_t align) const;

  uint64_t capacity_;
  uint64_t granule_;
  uint64_t used_ = 0;  // granules
  uint64_t peak_ = 0;  // granules
  std::vector<Block> blocks_;
  std::vector<uint32_t> spare_;  // unused indices of blocks_
  uint32_t first_ = kNone;       // the block at offset 0
  uint64_t fl_bitmap_ = 0;       // bit f: some class (f, *) is non-empty
  std::array<uint32_t, kFlCount> sl_bitmap_{};
  std::array<std::array<uint32_t, kSlCount>, kFlCount> heads_;
};

}  // namespace tiermem
