// TLSF offset allocator: size classes are (floor(log2 n), next 4 bits of n), found by bit scans.
#include "lib/tiers/offset_allocator.h"

#include <bit>
#include <cassert>

#include "io/checked.h"

namespace tiermem {

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t granule)
    : capacity_(capacity - capacity % granule), granule_(granule) {
  assert(granule > 0 && (granule & (granule - 1)) == 0);
  for (auto& row : heads_) row.fill(kNone);
  if (capacity_ / granule_ > 0) {
    uint32_t b = NewBlock();
    blocks_[b].offset = 0;
    blocks_[b].size = capacity_ / granule_;
    first_ = b;
    InsertFree(b);
  }
}

// Classes below 16 granules are linear (fl 0, sl = n); above, fl counts octaves and sl splits
// each octave in 16 equal steps.
void OffsetAllocator::Mapping(uint64_t n, uint32_t& fl, uint32_t& sl) {
  if (n < kSlCount) {
    fl = 0;
    sl = static_cast<uint32_t>(n);
    return;
  }
  int f = std::bit_width(n) - 1;  // >= kSlBits
  fl = static_cast<uint32_t>(f - kSlBits + 1);
  sl = static_cast<uint32_t>((n >> (f - kSlBits)) ^ kSlCount);
}

std::optional<uint64_t> OffsetAllocator::SearchSize(uint64_t bytes) const {
  uint64_t n = DivideRoundingUp(bytes, granule_);
  if (n >= kSlCount) {
    int f = std::bit_width(n) - 1;
    auto up = RoundUp(n, uint64_t{1} << (f - kSlBits));
    if (!up.has_value()) return std::nullopt;
    n = *up;
  }
  return CheckedMul(n, granule_);
}

uint32_t OffsetAllocator::NewBlock() {
  if (!spare_.empty()) {
    uint32_t b = spare_.back();
    spare_.pop_back();
    blocks_[b] = Block{};
    return b;
  }
  blocks_.emplace_back();
  return static_cast<uint32_t>(blocks_.size() - 1);
}

void OffsetAllocator::ReleaseBlock(uint32_t b) { spare_.push_back(b); }

void OffsetAllocator::InsertFree(uint32_t b) {
  uint32_t fl = 0, sl = 0;
  Mapping(blocks_[b].size, fl, sl);
  Block& blk = blocks_[b];
  blk.free = true;
  blk.prev_free = kNone;
  blk.next_free = heads_[fl][sl];
  if (blk.next_free != kNone) blocks_[blk.next_free].prev_free = b;
  heads_[fl][sl] = b;
  fl_bitmap_ |= uint64_t{1} << fl;
  sl_bitmap_[fl] |= 1u << sl;
}

void OffsetAllocator::RemoveFree(uint32_t b) {
  Block& blk = blocks_[b];
  uint32_t fl = 0, sl = 0;
  Mapping(blk.size, fl, sl);
  if (blk.prev_free != kNone) {
    blocks_[blk.prev_free].next_free = blk.next_free;
  } else {
    heads_[fl][sl] = blk.next_free;
    if (blk.next_free == kNone) {
      sl_bitmap_[fl] &= ~(1u << sl);
      if (sl_bitmap_[fl] == 0) fl_bitmap_ &= ~(uint64_t{1} << fl);
    }
  }
  if (blk.next_free != kNone) blocks_[blk.next_free].prev_free = blk.prev_free;
  blk.free = false;
  blk.prev_free = blk.next_free = kNone;
}

uint32_t OffsetAllocator::FindFree(uint32_t fl, uint32_t sl) const {
  if (fl >= kFlCount) return kNone;
  uint32_t sl_map = sl < kSlCount ? sl_bitmap_[fl] & (~0u << sl) : 0;
  if (sl_map == 0) {
    uint64_t fl_map = fl + 1 < kFlCount ? fl_bitmap_ & (~uint64_t{0} << (fl + 1)) : 0;
    if (fl_map == 0) return kNone;
    fl = static_cast<uint32_t>(std::countr_zero(fl_map));
    sl_map = sl_bitmap_[fl];
  }
  return heads_[fl][std::countr_zero(sl_map)];
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Allocate(uint64_t bytes,
                                                                     uint64_t alignment) {
  return AllocateAt(bytes, alignment, nullptr);
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Allocate(uint64_t bytes,
                                                                     uint64_t alignment,
                                                                     SideChooser side) {
  return AllocateAt(bytes, alignment, &side);
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::AllocateAt(uint64_t bytes,
                                                                       uint64_t alignment,
                                                                       const SideChooser* side) {
  if (bytes == 0 || (alignment & (alignment - 1)) != 0) return std::nullopt;
  // Granule counts never exceed capacity_ / granule_, so with the bound below nothing that
  // follows can wrap; the round-up itself is written not to wrap near 2^64.
  const uint64_t n = DivideRoundingUp(bytes, granule_);
  const uint64_t align = alignment > granule_ ? alignment / granule_ : 1;
  const uint64_t total = capacity_ / granule_;
  if (n > total || align - 1 > total - n) return std::nullopt;
  // Search one class up so that any block found fits without walking the list.
  auto search = SearchSize((n + align - 1) * granule_);
  if (!search.has_value()) return std::nullopt;
  uint32_t fl = 0, sl = 0;
  Mapping(*search / granule_, fl, sl);
  uint32_t b = FindFree(fl, sl);
  if (b == kNone) {
    // A block of at least n granules is in class(n) or above, and every class from the search
    // class up is empty: walk the lists of the classes in between.
    uint32_t lo_fl = 0, lo_sl = 0, hi_fl = 0, hi_sl = 0;
    Mapping(n, lo_fl, lo_sl);
    Mapping(*search / granule_, hi_fl, hi_sl);
    for (uint32_t f = lo_fl, s = lo_sl; b == kNone && (f < hi_fl || (f == hi_fl && s < hi_sl));) {
      b = WalkClass(f, s, n, align);
      if (++s == kSlCount) {
        s = 0;
        ++f;
      }
    }
    if (b == kNone) return std::nullopt;
  }
  RemoveFree(b);

  // Give the unaligned front back as its own free block (or, placed at the back, all of the
  // leftover before the request).
  uint64_t start = (blocks_[b].offset + align - 1) / align * align;
  if (side != nullptr && blocks_[b].size > n &&
      (*side)(blocks_[b].prev_phys, blocks_[b].next_phys) == Side::kBack) {
    const uint64_t back = (blocks_[b].offset + blocks_[b].size - n) / align * align;
    if (back > start) start = back;
  }
  if (uint64_t pad = start - blocks_[b].offset; pad > 0) {
    uint32_t front = NewBlock();
    Block& blk = blocks_[b];
    blocks_[front].offset = blk.offset;
    blocks_[front].size = pad;
    blocks_[front].prev_phys = blk.prev_phys;
    blocks_[front].next_phys = b;
    if (blk.prev_phys != kNone) blocks_[blk.prev_phys].next_phys = front;
    if (first_ == b) first_ = front;
    blk.prev_phys = front;
    blk.offset += pad;
    blk.size -= pad;
    InsertFree(front);
  }
  // Give the tail back.
  if (blocks_[b].size > n) {
    uint32_t tail = NewBlock();
    Block& blk = blocks_[b];
    blocks_[tail].offset = blk.offset + n;
    blocks_[tail].size = blk.size - n;
    blocks_[tail].prev_phys = b;
    blocks_[tail].next_phys = blk.next_phys;
    if (blk.next_phys != kNone) blocks_[blk.next_phys].prev_phys = tail;
    blk.next_phys = tail;
    blk.size = n;
    InsertFree(tail);
  }
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  return Allocation{blocks_[b].offset * granule_, n * granule_, b};
}

std::optional<uint64_t> OffsetAllocator::SlideDown(uint32_t b) {
  assert(b < blocks_.size() && !blocks_[b].free);
  const uint32_t p = blocks_[b].prev_phys;
  if (p == kNone || !blocks_[p].free) return std::nullopt;
  RemoveFree(p);
  // Physical order: before, p (free), b, after  ->  before, b, p (free), after.
  Block& blk = blocks_[b];
  Block& hole = blocks_[p];
  const uint32_t before = hole.prev_phys, after = blk.next_phys;
  blk.offset = hole.offset;
  hole.offset = blk.offset + blk.size;
  blk.prev_phys = before;
  blk.next_phys = p;
  hole.prev_phys = b;
  hole.next_phys = after;
  if (before != kNone) {
    blocks_[before].next_phys = b;
  } else {
    first_ = b;
  }
  if (after != kNone) blocks_[after].prev_phys = p;
  if (after != kNone && blocks_[after].free) {  // two free neighbours: one block
    RemoveFree(after);
    hole.size += blocks_[after].size;
    hole.next_phys = blocks_[after].next_phys;
    if (hole.next_phys != kNone) blocks_[hole.next_phys].prev_phys = p;
    ReleaseBlock(after);
  }
  InsertFree(p);
  return blocks_[b].offset * granule_;
}

void OffsetAllocator::Free(uint32_t b) {
  assert(b < blocks_.size() && !blocks_[b].free);
  used_ -= blocks_[b].size;
  // Merge with free neighbours so that two free blocks are never adjacent.
  if (uint32_t p = blocks_[b].prev_phys; p != kNone && blocks_[p].free) {
    RemoveFree(p);
    blocks_[p].size += blocks_[b].size;
    blocks_[p].next_phys = blocks_[b].next_phys;
    if (blocks_[b].next_phys != kNone) blocks_[blocks_[b].next_phys].prev_phys = p;
    ReleaseBlock(b);
    b = p;
  }
  if (uint32_t nx = blocks_[b].next_phys; nx != kNone && blocks_[nx].free) {
    RemoveFree(nx);
    blocks_[b].size += blocks_[nx].size;
    blocks_[b].next_phys = blocks_[nx].next_phys;
    if (blocks_[nx].next_phys != kNone) blocks_[blocks_[nx].next_phys].prev_phys = b;
    ReleaseBlock(nx);
  }
  InsertFree(b);
}

uint32_t OffsetAllocator::WalkClass(uint32_t fl, uint32_t sl, uint64_t n, uint64_t align) const {
  if (fl >= kFlCount || sl >= kSlCount) return kNone;
  for (uint32_t b = heads_[fl][sl]; b != kNone; b = blocks_[b].next_free) {
    const Block& blk = blocks_[b];
    const uint64_t start = (blk.offset + align - 1) / align * align;
    if (start - blk.offset < blk.size && blk.size - (start - blk.offset) >= n) return b;
  }
  return kNone;
}

uint64_t OffsetAllocator::LargestFree() const {
  if (fl_bitmap_ == 0) return 0;
  uint32_t fl = static_cast<uint32_t>(63 - std::countl_zero(fl_bitmap_));
  uint32_t sl = static_cast<uint32_t>(31 - std::countl_zero(sl_bitmap_[fl]));
  uint64_t best = 0;
  for (uint32_t b = heads_[fl][sl]; b != kNone; b = blocks_[b].next_free) {
    if (blocks_[b].size > best) best = blocks_[b].size;
  }
  return best * granule_;
}

}  // namespace tiermem
