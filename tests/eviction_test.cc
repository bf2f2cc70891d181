// The eviction unit alone: the cheapest window over fragmented layouts, walls never crossed,
// ties, and the cost's order (Belady for single victims of equal size).
#include "lib/policy/eviction.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tiermem {
namespace {

using Kind = EvictionSlot::Kind;

EvictionSlot Free(uint64_t size) { return {size, Kind::kFree, 0}; }
EvictionSlot Wall(uint64_t size) { return {size, Kind::kWall, 0}; }
EvictionSlot Copy(uint64_t size, double cost) { return {size, Kind::kEvictable, cost}; }

TEST(CheapestWindow, FreeHoleCostsNothing) {
  std::vector<EvictionSlot> s = {Copy(4, 1), Free(8), Copy(4, 1)};
  auto w = CheapestWindow(s, 8);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 1u);
  EXPECT_EQ(w->last, 1u);
  EXPECT_EQ(w->victims, 0u);
  EXPECT_EQ(w->cost, 0);
}

TEST(CheapestWindow, JoinsHolesAcrossTheCheapestCopy) {
  // 12 bytes are free in total but no hole holds 6: the window clears one copy between holes.
  std::vector<EvictionSlot> s = {Free(3), Copy(2, 50), Free(3), Copy(2, 5),
                                 Free(3), Wall(1),     Free(3)};
  auto w = CheapestWindow(s, 6);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 2u);
  EXPECT_EQ(w->last, 4u);
  EXPECT_EQ(w->victims, 1u);
  EXPECT_EQ(w->cost, 5);
  EXPECT_EQ(w->bytes, 8u);
  EXPECT_EQ(w->evicted_bytes, 2u);
}

TEST(CheapestWindow, NeverCrossesAWall) {
  std::vector<EvictionSlot> s = {Free(3), Wall(1), Free(3), Wall(1), Copy(3, 1), Free(1)};
  EXPECT_FALSE(CheapestWindow(s, 5).has_value());
  auto w = CheapestWindow(s, 4);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 4u);
  EXPECT_EQ(w->last, 5u);
}

TEST(CheapestWindow, SeveralCheapVictimsBeatOneDearOne) {
  std::vector<EvictionSlot> s = {Copy(10, 100), Wall(1), Copy(4, 1), Copy(3, 1), Copy(3, 1)};
  auto w = CheapestWindow(s, 10);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 2u);
  EXPECT_EQ(w->last, 4u);
  EXPECT_EQ(w->cost, 3);
}

TEST(CheapestWindow, TieGoesToFewerEvictedBytes) {
  std::vector<EvictionSlot> s = {Copy(8, 0), Wall(1), Free(4), Copy(4, 0)};
  auto w = CheapestWindow(s, 8);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 2u);
  EXPECT_EQ(w->evicted_bytes, 4u);
}

TEST(CheapestWindow, NothingFitsOrNothingAsked) {
  EXPECT_FALSE(CheapestWindow({}, 1).has_value());
  EXPECT_FALSE(CheapestWindow({Free(4)}, 0).has_value());
  EXPECT_FALSE(CheapestWindow({Wall(100)}, 1).has_value());
}

// Against brute force on random fragmented layouts: the same least cost, never a wall inside.
TEST(CheapestWindow, MatchesBruteForceOnRandomLayouts) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::vector<EvictionSlot> s(1 + rng() % 24);
    for (auto& slot : s) {
      const uint64_t size = 1 + rng() % 9;
      switch (rng() % 4) {
        case 0:
          slot = Free(size);
          break;
        case 1:
          slot = Wall(size);
          break;
        default:
          slot = Copy(size, static_cast<double>(rng() % 20));
          break;
      }
    }
    const uint64_t need = 1 + rng() % 30;
    std::optional<double> best;
    for (size_t i = 0; i < s.size(); ++i) {
      uint64_t bytes = 0;
      double cost = 0;
      for (size_t j = i; j < s.size() && s[j].kind != Kind::kWall; ++j) {
        bytes += s[j].size;
        cost += s[j].cost;
        if (bytes >= need) {
          if (!best.has_value() || cost < *best) best = cost;
          break;
        }
      }
    }
    auto w = CheapestWindow(s, need);
    ASSERT_EQ(w.has_value(), best.has_value()) << "round " << round;
    if (!w.has_value()) continue;
    EXPECT_NEAR(w->cost, *best, 1e-9) << "round " << round;
    uint64_t bytes = 0;
    for (size_t k = w->first; k <= w->last; ++k) {
      ASSERT_NE(s[k].kind, Kind::kWall) << "round " << round;
      bytes += s[k].size;
    }
    EXPECT_GE(bytes, need);
    EXPECT_EQ(bytes, w->bytes);
  }
}

TEST(EvictionCost, OrdersAsBeladyForEqualSizes) {
  const uint64_t horizon = 100;
  EXPECT_GT(EvictionCost(64, false, 1, horizon), EvictionCost(64, false, 50, horizon));
  EXPECT_GT(EvictionCost(64, false, 50, horizon), EvictionCost(64, false, kNoNextUse, horizon));
  // Dirty copies cost their write-down too.
  EXPECT_GT(EvictionCost(64, true, 50, horizon), EvictionCost(64, false, 50, horizon));
  // Never used again: only its bytes.
  EXPECT_EQ(EvictionCost(64, false, kNoNextUse, horizon), 64.0);
}

}  // namespace
}  // namespace tiermem
