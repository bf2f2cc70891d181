// Free bytes split into holes: a demand evicts the one window between two holes rather than
// every copy, slides a copy used again rather than evict it, and needs neither with HBM mapped
// in chunks; a copy's leftover stays next to the neighbour eviction takes; a prefetch lands
// between copies in use by compaction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "pressure_api.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::PressureApi;

constexpr uint64_t kMiB = 1 << 20;

// Copies of `sizes` filling a 12 MiB HBM, byte i + 1 in the i-th; the 1st and 3rd then offloaded
// to DRAM, which leaves their bytes free in two holes; then a 5 MiB demand ("wide"). With
// keep_last the last copy stays acquired throughout (a wall). Checks every copy's bytes after.
class SplitHbm : public PressureApi {
 public:
  void Run(const std::vector<uint64_t>& sizes, bool keep_last) {
    Open(12 * kMiB, 96 * kMiB, 0);
    for (size_t i = 0; i < sizes.size(); ++i) {
      t_.push_back(Make(sizes[i], ("f" + std::to_string(i)).c_str()));
      void* p = nullptr;
      ASSERT_EQ(tm_tensor_acquire(rt_, t_[i], TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK);
      std::memset(p, static_cast<int>(i + 1), sizes[i]);
      if (!keep_last || i + 1 < sizes.size()) {
        ASSERT_EQ(tm_tensor_release(rt_, t_[i], TM_TIER_HBM), TM_OK);
      }
    }
    ASSERT_EQ(testing::OffloadNow(rt_, t_[0], TM_TIER_DRAM), TM_OK);
    ASSERT_EQ(testing::OffloadNow(rt_, t_[2], TM_TIER_DRAM), TM_OK);
    tm_tensor wide = Make(5 * kMiB, "wide");
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, wide, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
        << tm_last_error();
    ASSERT_EQ(tm_tensor_release(rt_, wide, TM_TIER_HBM), TM_OK);
    if (keep_last) {
      ASSERT_EQ(tm_tensor_release(rt_, t_.back(), TM_TIER_HBM), TM_OK);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> back(sizes[i]);
      ASSERT_EQ(tm_tensor_read(rt_, t_[i], 0, back.data(), back.size()), TM_OK);
      EXPECT_EQ(std::count(back.begin(), back.end(), i + 1), static_cast<long>(back.size()));
    }
  }
  std::vector<tm_tensor> t_;
};

// Free bytes suffice but no hole does: one copy between two holes is evicted, not every copy.
// Sizes 3, 4, 3, 2 MiB: two 3 MiB holes. The 4 MiB copy is the only one of its bytes and longer
// than a hole, so it cannot slide (compaction), and the 2 MiB one stays acquired (a wall);
// evicting the 4 MiB copy makes the room.
TEST_F(SplitHbm, FragmentedTierEvictsAWindow) {
  UseLayout("slab");
  Run({3 * kMiB, 4 * kMiB, 3 * kMiB, 2 * kMiB}, true);
  const tm_stats s = Stats();
  EXPECT_EQ(s.evictions, 1u) << "one neighbour of a hole";
  EXPECT_EQ(s.fragmentation_evictions, 1u);
  EXPECT_EQ(s.relocations, 0u);
}

// The same split with 3 MiB copies: sliding the one between the holes down (3 MiB, device to
// device) merges them and costs no more bytes than evicting it, which would write it down and
// read it back over the link. The demand slides it instead, and evicts nothing.
TEST_F(SplitHbm, DemandSlidesACopyRatherThanEvictOneUsedAgain) {
  UseLayout("slab");
  Run({3 * kMiB, 3 * kMiB, 3 * kMiB, 3 * kMiB}, false);
  const tm_stats s = Stats();
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.relocations, 1u);
  EXPECT_EQ(s.relocation_bytes, 3 * kMiB);
}

// A split with HBM mapped in chunks of 2 MiB: copies of 2, 4, 2 and 2 MiB, the first and third
// then written down, leave 6 MiB free in three holes of 2 MiB (a slab would have to evict or
// slide to place 5 MiB). Mapped, the 5 MiB request (three chunks) takes the free chunks as they
// are: nothing is evicted and nothing slides, the last copy acquired or not.
TEST_F(SplitHbm, MappedLayoutNeedsNoWindow) {
  for (const char* layout : {"slab", "mapped"}) {
    for (bool keep_last : {true, false}) {
      SCOPED_TRACE(std::string(layout) + (keep_last ? ", last copy acquired" : ", all released"));
      UseLayout(layout);
      Run({2 * kMiB, 4 * kMiB, 2 * kMiB, 2 * kMiB}, keep_last);
      char shown[16] = {};
      ASSERT_EQ(tm_runtime_config_value(rt_, "TIERMEM_HBM_LAYOUT", shown, sizeof shown, nullptr),
                TM_OK);
      EXPECT_STREQ(shown, layout);
      const tm_stats s = Stats();
      if (std::string(layout) == "slab") {
        // The control: the same requests need a window in a slab.
        EXPECT_GT(s.evictions + s.relocations, 0u);
      } else {
        EXPECT_EQ(s.evictions, 0u);
        EXPECT_EQ(s.fragmentation_evictions, 0u);
        EXPECT_EQ(s.relocations, 0u);
      }
      tm_runtime_destroy(rt_);
      rt_ = tm_runtime{};
      t_.clear();
    }
  }
}

// A copy smaller than its hole takes the end away from the neighbour that frees sooner, so that
// the leftover and that neighbour later form one window. Placed at the front of each hole (the
// plain allocator), "a", "b", "c" take [0, 4), [4, 8), [8, 14) MiB and leave 2 MiB at the end,
// apart from "b"'s 4 MiB, with "a" and "c" pinned: "d" could not fit (TM_ERR_OUT_OF_MEMORY)
// though the bytes are there. Placed by their neighbours: "b" goes to [12, 16) (away from "a",
// in use), "c" to [4, 10) (away from the end, next to "b" which eviction may take), and "d"
// takes the window [10, 16) once "b" is written down.
TEST_F(PressureApi, LeftoverOfAHoleStaysNextToTheCopyEvictionTakes) {
  Open(16 * kMiB, 96 * kMiB, 0);
  auto acquire = [&](tm_tensor h, int value) {
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, h, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
        << tm_last_error();
    std::memset(p, value, 4 * kMiB);
  };
  tm_tensor a = Make(4 * kMiB, "a"), b = Make(4 * kMiB, "b");
  tm_tensor c = Make(6 * kMiB, "c"), d = Make(6 * kMiB, "d");
  acquire(a, 1);  // in use throughout
  acquire(b, 2);  // then released: evictable
  ASSERT_EQ(tm_tensor_release(rt_, b, TM_TIER_HBM), TM_OK);
  acquire(c, 3);
  acquire(d, 4);
  EXPECT_EQ(Stats().evictions, 1u);
  for (tm_tensor h : {a, c, d}) ASSERT_EQ(tm_tensor_release(rt_, h, TM_TIER_HBM), TM_OK);
  std::vector<uint8_t> back(4 * kMiB);
  ASSERT_EQ(tm_tensor_read(rt_, b, 0, back.data(), back.size()), TM_OK);
  EXPECT_EQ(back.front(), 2);
  EXPECT_EQ(back.back(), 2);
}

// Compaction: 8 MiB free in two holes split by a copy that the schedule uses first, so that a
// prefetch may not evict it (do no harm) and no window exists. In a slab, the copy slides down
// (device to device) and the holes merge; mapped in chunks, nothing has to. Either way the
// prefetch lands, and the copy's bytes are intact.
class SplitPrefetch : public PressureApi, public ::testing::WithParamInterface<const char*> {};

TEST_P(SplitPrefetch, LandsBetweenCopiesInUse) {
  const bool slab = std::string(GetParam()) == "slab";
  UseLayout(GetParam());
  Open(16 * kMiB, 96 * kMiB, 2);
  auto write = [&](tm_tensor h, int value, bool keep) {
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, h, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
        << tm_last_error();
    std::memset(p, value, 4 * kMiB);
    if (!keep) {
      ASSERT_EQ(tm_tensor_release(rt_, h, TM_TIER_HBM), TM_OK);
    }
  };
  // A [0, 4) in use; B at the end (away from A); C [4, 8) in use; D fills [8, 12).
  tm_tensor a = Make(4 * kMiB, "a"), b = Make(4 * kMiB, "b"), c = Make(4 * kMiB, "c");
  tm_tensor d = Make(4 * kMiB, "d");
  write(a, 1, true);
  write(b, 2, false);
  write(c, 3, true);
  write(d, 4, false);
  ASSERT_EQ(tm_tensor_release(rt_, c, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_destroy(rt_, c), TM_OK);
  ASSERT_EQ(tm_tensor_destroy(rt_, b), TM_OK);  // [a][4 MiB free][d][4 MiB free]
  std::vector<uint8_t> bytes(8 * kMiB, 5);
  tm_tensor x = Make(8 * kMiB, "x", TM_CLASS_OTHER, TM_TIER_DRAM);
  ASSERT_EQ(tm_tensor_write(rt_, x, 0, bytes.data(), bytes.size()), TM_OK) << tm_last_error();
  const tm_tensor order[] = {d, x};
  ASSERT_EQ(tm_schedule_set(rt_, order, nullptr, 2), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_step_begin(rt_), TM_OK);  // prefetches x into HBM
  ASSERT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
  uint32_t mask = 0;
  ASSERT_EQ(tm_tensor_residency(rt_, x, &mask), TM_OK);
  EXPECT_NE(mask & TM_TIER_BIT(TM_TIER_HBM), 0u) << "the prefetch of x was dropped";
  const tm_stats s = Stats();
  // Mapped in chunks, x takes the two holes as they are: nothing needs to slide.
  EXPECT_EQ(s.relocations, slab ? 1u : 0u);
  EXPECT_EQ(s.relocation_bytes, slab ? 4 * kMiB : 0u);
  EXPECT_EQ(s.evictions, 0u);
  ASSERT_EQ(tm_tensor_residency(rt_, d, &mask), TM_OK);
  EXPECT_EQ(mask, TM_TIER_BIT(TM_TIER_HBM)) << "d slid within HBM, not evicted";
  std::vector<uint8_t> back(4 * kMiB);
  ASSERT_EQ(tm_tensor_read(rt_, d, 0, back.data(), back.size()), TM_OK);
  EXPECT_EQ(std::count(back.begin(), back.end(), 4), static_cast<long>(back.size()));
  ASSERT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_step_end(rt_), TM_OK);
}

INSTANTIATE_TEST_SUITE_P(PressureApi, SplitPrefetch, ::testing::Values("slab", "mapped"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace tiermem
