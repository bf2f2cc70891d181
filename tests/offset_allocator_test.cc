// The TLSF allocator against a reference model of the range under random alloc/free.
#include "lib/tiers/offset_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "lib/tiers/tier_space.h"

namespace tiermem {
namespace {

// Reference: the set of reserved ranges, kept in an ordered map.
class Reference {
 public:
  explicit Reference(uint64_t capacity) : capacity_(capacity) {}
  // True when [off, off+size) lies inside the range and overlaps nothing reserved.
  bool Fits(uint64_t off, uint64_t size) const {
    if (off + size > capacity_) return false;
    auto next = used_.lower_bound(off);
    if (next != used_.end() && next->first < off + size) return false;
    if (next != used_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second > off) return false;
    }
    return true;
  }
  void Add(uint64_t off, uint64_t size) { used_[off] = size; }
  void Remove(uint64_t off) { used_.erase(off); }
  uint64_t LargestGap() const {
    uint64_t best = 0, pos = 0;
    for (auto [o, s] : used_) {
      best = std::max(best, o - pos);
      pos = o + s;
    }
    return std::max(best, capacity_ - pos);
  }
  uint64_t Used() const {
    uint64_t u = 0;
    for (auto [o, s] : used_) u += s;
    return u;
  }

 private:
  uint64_t capacity_;
  std::map<uint64_t, uint64_t> used_;
};

TEST(OffsetAllocator, WholeRangeThenNothing) {
  OffsetAllocator a(1 << 20, 4096);
  auto x = a.Allocate(1 << 20);
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->offset, 0u);
  EXPECT_EQ(a.used(), 1u << 20);
  EXPECT_FALSE(a.Allocate(1).has_value());
  a.Free(x->block);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.peak(), 1u << 20);
  EXPECT_EQ(a.LargestFree(), 1u << 20);
}

TEST(OffsetAllocator, RejectsZeroAndTooLarge) {
  OffsetAllocator a(1 << 20, 4096);
  EXPECT_FALSE(a.Allocate(0).has_value());
  EXPECT_FALSE(a.Allocate((1 << 20) + 1).has_value());
  EXPECT_FALSE(a.Allocate(4096, 3).has_value());  // alignment not a power of two
}

// Sizes near 2^64 once rounded up to 0 granules: an allocation of "nothing" that aliased the
// next block. They must be refused, and leave the allocator as it was.
TEST(OffsetAllocator, RefusesSizesThatWouldWrap) {
  for (uint64_t granule : {256u, 4096u}) {
    OffsetAllocator a(1 << 20, granule);
    auto first = a.Allocate(4096);
    ASSERT_TRUE(first.has_value());
    for (uint64_t bytes : {UINT64_MAX, UINT64_MAX - granule + 2, UINT64_MAX - granule + 1,
                           uint64_t{1} << 63, (uint64_t{1} << 63) + 1}) {
      EXPECT_FALSE(a.Allocate(bytes).has_value()) << bytes;
      EXPECT_FALSE(a.Allocate(bytes, 1 << 20).has_value()) << bytes;
    }
    EXPECT_FALSE(a.Allocate(4096, uint64_t{1} << 63).has_value());  // alignment beyond the range
    EXPECT_EQ(a.used(), 4096u);
    auto second = a.Allocate(4096);
    ASSERT_TRUE(second.has_value());
    EXPECT_GE(second->offset, first->offset + first->size);  // no overlap with the first
  }
  OffsetAllocator a(1 << 20, 4096);
  EXPECT_FALSE(a.SearchSize(UINT64_MAX).has_value());
  EXPECT_FALSE(a.SearchSize(UINT64_MAX - 4094).has_value());
  EXPECT_EQ(a.SearchSize(1).value(), 4096u);
  EXPECT_EQ(a.SearchSize(uint64_t{1} << 62).value(), uint64_t{1} << 62);
}

TEST(OffsetAllocator, RoundsToGranule) {
  OffsetAllocator a(1 << 20, 4096);
  auto x = a.Allocate(1);
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->size, 4096u);
  auto y = a.Allocate(4097);
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(y->size, 8192u);
  EXPECT_EQ(y->offset % 4096, 0u);
}

TEST(OffsetAllocator, HonoursAlignment) {
  OffsetAllocator a(64 << 20, 256);
  ASSERT_TRUE(a.Allocate(256).has_value());  // shift the free block off alignment
  for (uint64_t align : {4096u, 65536u, 1u << 20}) {
    auto x = a.Allocate(1000, align);
    ASSERT_TRUE(x.has_value()) << align;
    EXPECT_EQ(x->offset % align, 0u) << align;
  }
}

TEST(OffsetAllocator, CoalescesNeighbours) {
  OffsetAllocator a(16 * 4096, 4096);
  std::vector<OffsetAllocator::Allocation> v;
  for (int i = 0; i < 16; ++i) v.push_back(*a.Allocate(4096));
  // Free in an order that needs merging on both sides.
  for (int i : {1, 3, 2, 0, 5, 4, 15, 7, 6, 9, 8, 11, 10, 13, 12, 14}) a.Free(v[i].block);
  auto all = a.Allocate(16 * 4096);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->offset, 0u);
}

// Random alloc/free against the reference: no overlap, exact accounting, and a failure only
// when the reference has no gap as large as the request's search size plus alignment slack.
// The range fills within a few thousand steps; the sanitized builds (10x slower per step) walk
// a quarter as many, which still fills and drains it many times over.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kRandomSteps = 50000;
#else
constexpr int kRandomSteps = 200000;
#endif
TEST(OffsetAllocator, MatchesReferenceUnderRandomLoad) {
  for (uint64_t granule : {256u, 4096u}) {
    const uint64_t capacity = 256ull << 20;
    OffsetAllocator a(capacity, granule);
    Reference ref(capacity);
    std::mt19937_64 rng(granule);
    std::vector<OffsetAllocator::Allocation> live;
    int failures = 0;
    for (int step = 0; step < kRandomSteps; ++step) {
      bool alloc = live.empty() || rng() % 100 < 55;
      if (alloc) {
        // Sizes spread over 1 B .. 16 MiB, log-uniform, sometimes aligned.
        uint64_t size = 1 + (rng() % (uint64_t{1} << (rng() % 24)));
        uint64_t align = rng() % 8 == 0 ? (uint64_t{1} << (8 + rng() % 10)) : 0;
        auto x = a.Allocate(size, align);
        if (!x.has_value()) {
          ++failures;
          uint64_t slack = align > granule ? align - granule : 0;
          ASSERT_LT(ref.LargestGap(), a.SearchSize(size + slack).value())
              << "refused " << size << " with a gap of " << ref.LargestGap();
          continue;
        }
        ASSERT_GE(x->size, size);
        ASSERT_EQ(x->offset % granule, 0u);
        if (align > 0) {
          ASSERT_EQ(x->offset % align, 0u);
        }
        ASSERT_TRUE(ref.Fits(x->offset, x->size)) << "overlap at " << x->offset;
        ref.Add(x->offset, x->size);
        live.push_back(*x);
      } else {
        size_t i = rng() % live.size();
        a.Free(live[i].block);
        ref.Remove(live[i].offset);
        live[i] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(a.used(), ref.Used());
    }
    EXPECT_GT(failures, 0) << "the load never filled the range";
    for (auto& x : live) a.Free(x.block);
    EXPECT_EQ(a.used(), 0u);
    EXPECT_EQ(a.LargestFree(), capacity);
  }
}

// The chooser sees a free block's neighbours and picks the end the request takes.
TEST(OffsetAllocator, SideChooserPlacesTheRequestAtEitherEnd) {
  OffsetAllocator a(16 * 4096, 4096);
  auto x = a.Allocate(4 * 4096), y = a.Allocate(4 * 4096), z = a.Allocate(4 * 4096);
  ASSERT_TRUE(x && y && z);
  a.Free(y->block);  // a hole of 4 granules between x and z
  uint32_t seen_prev = OffsetAllocator::kNone, seen_next = OffsetAllocator::kNone;
  auto back = [&](uint32_t prev, uint32_t next) {
    seen_prev = prev;
    seen_next = next;
    return OffsetAllocator::Side::kBack;
  };
  auto at_back = a.Allocate(4096, 0, back);
  ASSERT_TRUE(at_back);
  EXPECT_EQ(at_back->offset, 7 * 4096u) << "the hole's last granule";
  EXPECT_EQ(seen_prev, x->block);
  EXPECT_EQ(seen_next, z->block);
  auto front = [](uint32_t, uint32_t) { return OffsetAllocator::Side::kFront; };
  auto at_front = a.Allocate(4096, 0, front);
  ASSERT_TRUE(at_front);
  EXPECT_EQ(at_front->offset, 4 * 4096u);
  // The tier's end: no neighbour after it ([12, 16) is the one hole of 3 granules).
  auto tail = a.Allocate(3 * 4096, 0, back);
  ASSERT_TRUE(tail);
  EXPECT_EQ(seen_prev, z->block);
  EXPECT_EQ(seen_next, OffsetAllocator::kNone);
  EXPECT_EQ(tail->offset, 13 * 4096u);
  // A block that fits exactly is not asked about.
  a.Free(at_back->block);
  a.Free(at_front->block);
  seen_prev = seen_next = 12345;
  auto exact = a.Allocate(4 * 4096, 0, back);
  ASSERT_TRUE(exact);
  EXPECT_EQ(exact->offset, 4 * 4096u);
  EXPECT_EQ(seen_prev, 12345u);
}

}  // namespace
}  // namespace tiermem

namespace tiermem {
namespace {

TEST(HumanBytes, ShowsTheExactCountWhenFourDigitsWouldRound) {
  EXPECT_EQ(HumanBytes(1000), "1000 B");
  EXPECT_EQ(HumanBytes(4095), "3.999 KiB (4095 B)");
  EXPECT_EQ(HumanBytes(64 << 20), "64 MiB");
  EXPECT_EQ(HumanBytes(3 << 29), "1.5 GiB");
  EXPECT_EQ(HumanBytes((2 << 20) - 1), "2 MiB (2097151 B)");
  EXPECT_EQ(HumanBytes((2 << 20) + 1), "2 MiB (2097153 B)");
  EXPECT_EQ(HumanBytes(UINT64_MAX), "16 EiB (18446744073709551615 B)");
}

// A request one byte over the free room must not read as "needs 2 MiB; 2 MiB are free".
TEST(TierSpace, FullMessageTellsNeedAndFreeApart) {
  TierSpace space(TM_TIER_DRAM, 4 << 20, 1);
  ASSERT_TRUE(space.Allocate(2 << 20, "a").ok());
  auto s = space.Allocate((2 << 20) + 1, "b");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.status().message()).find("needs 2 MiB (2097153 B); 2 MiB of 4 MiB"),
            std::string::npos)
      << s.status().message();
}

}  // namespace
}  // namespace tiermem
