// Do no harm: a scheduled prefetch takes room only where no earlier use needs it. It counts the
// room a held copy gives back before that use, leaves a fresh tensor made earlier its hole in a
// slab, and evicts nothing for a prefetch its hole check then drops.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "pressure_api.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::PressureApi;
using testing::RandomBytes;

constexpr uint64_t kMiB = 1 << 20;

// A step's body in the hole tests: a fresh f of f_bytes written in HBM and destroyed, then y
// read there, checked against ys, and destroyed.
void WriteFreshThenRead(PressureApi& test, uint64_t f_bytes, tm_tensor y,
                        const std::vector<uint8_t>& ys) {
  const tm_runtime rt = test.rt_;
  void* p = nullptr;
  tm_tensor f = test.Make(f_bytes, "f");
  ASSERT_EQ(tm_tensor_acquire(rt, f, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
      << tm_last_error();
  std::memset(p, 5, f_bytes);
  ASSERT_EQ(tm_tensor_release(rt, f, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_destroy(rt, f), TM_OK);
  ASSERT_EQ(tm_tensor_acquire(rt, y, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
      << tm_last_error();
  EXPECT_EQ(std::memcmp(p, ys.data(), ys.size()), 0);
  ASSERT_EQ(tm_tensor_release(rt, y, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_destroy(rt, y), TM_OK);
}

// Do no harm counts the room a held copy gives back before an earlier use, as the recorded step
// shows it. HBM of 32 MiB; each step acquires x (16 MiB, homed in DRAM: clean in HBM), makes a
// fresh f (16 MiB), then reads y (16 MiB). While x is held, y's prefetch (its one earlier use
// f needs 16 MiB, and only 16 are free) may run only if x is let go before f is made: then f's
// room is x's, dropped for nothing. A step that holds x until after f made says otherwise, and
// there the prefetch must wait: taken early, f's demand would throw it out again.
class HeldCopy : public PressureApi, public ::testing::WithParamInterface<bool> {};

TEST_P(HeldCopy, PrefetchCountsTheRoomItsHolderLetsGoBeforeAnEarlierUse) {
  const bool released_first = GetParam();
  // In flight, x's own prefetch (which its acquire joins) must not hold y's back.
  env_.Set("TIERMEM_PREFETCH_BYTES", "100%");
  Open(32 * kMiB, 96 * kMiB, 2);
  tm_tensor x = Make(16 * kMiB, "x", TM_CLASS_OTHER, TM_TIER_DRAM);
  tm_tensor y = Make(16 * kMiB, "y", TM_CLASS_OTHER, TM_TIER_DRAM);
  const auto xs = RandomBytes(16 * kMiB, 21), ys = RandomBytes(16 * kMiB, 22);
  ASSERT_EQ(tm_tensor_write(rt_, x, 0, xs.data(), xs.size()), TM_OK);
  ASSERT_EQ(tm_tensor_write(rt_, y, 0, ys.data(), ys.size()), TM_OK);
  const int steps = 4;
  std::vector<uint32_t> y_when_x_held;  // y's residency once its prefetch has run
  tm_stats before_last{};
  for (int step = 0; step < steps; ++step) {
    if (step == steps - 1) before_last = Stats();
    ASSERT_EQ(tm_step_begin(rt_), TM_OK);
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, x, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
    ASSERT_EQ(std::memcmp(p, xs.data(), xs.size()), 0);
    ASSERT_EQ(tm_tensor_sync(rt_, y), TM_OK) << "y's prefetch, if any, has run";
    uint32_t mask = 0;
    ASSERT_EQ(tm_tensor_residency(rt_, y, &mask), TM_OK);
    y_when_x_held.push_back(mask);
    if (released_first) {
      ASSERT_EQ(tm_tensor_release(rt_, x, TM_TIER_HBM), TM_OK);
    }
    tm_tensor f = Make(16 * kMiB, "f");
    ASSERT_EQ(tm_tensor_acquire(rt_, f, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
        << tm_last_error();
    std::memset(p, 7, 16 * kMiB);
    ASSERT_EQ(tm_tensor_release(rt_, f, TM_TIER_HBM), TM_OK);
    if (!released_first) {
      ASSERT_EQ(tm_tensor_release(rt_, x, TM_TIER_HBM), TM_OK);
    }
    ASSERT_EQ(tm_tensor_acquire(rt_, y, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
        << tm_last_error();
    EXPECT_EQ(std::memcmp(p, ys.data(), ys.size()), 0);
    ASSERT_EQ(tm_tensor_release(rt_, y, TM_TIER_HBM), TM_OK);
    ASSERT_EQ(tm_tensor_destroy(rt_, f), TM_OK);
    // Each step starts with x and y in DRAM only.
    for (tm_tensor t : {x, y}) ASSERT_EQ(testing::OffloadNow(rt_, t, TM_TIER_DRAM), TM_OK);
    ASSERT_EQ(tm_step_end(rt_), TM_OK);
  }
  ASSERT_EQ(tm_runtime_sync(rt_), TM_OK);
  const tm_stats s = Stats();
  // The first step records the schedule (no prefetch); the second replays it.
  for (int step = 1; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ((y_when_x_held[step] & TM_TIER_BIT(TM_TIER_HBM)) != 0, released_first)
        << (released_first ? "y's prefetch was dropped though x is let go before f"
                           : "y was prefetched into the room f needs while x is held");
  }
  // Either way x and y cross the link once each a step: y is never brought early only to be
  // thrown out by the demand for f.
  EXPECT_EQ(
      s.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM] - before_last.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM],
      32 * kMiB);
}

INSTANTIATE_TEST_SUITE_P(Release, HeldCopy, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("BeforeTheFreshTensor")
                                          : std::string("AfterTheFreshTensor");
                         });

// Do no harm in a slab counts holes, not only bytes. HBM of 30 MiB holds two copies acquired
// for good and two holes between them, of 12 and 6 MiB. Each step makes a fresh f (10 MiB),
// then reads y (8 MiB, homed in DRAM). The free bytes (18) cover both, but each fits only in the
// 12 MiB hole: y's prefetch, taken first, would leave f no hole, and f's demand would throw y
// out again. So the prefetch waits, and y crosses the link once a step. (The fills' order makes
// the holes apart in the slab's placement; the probe checks that it did.)
TEST_F(PressureApi, PrefetchLeavesAnEarlierFreshTensorItsHole) {
  UseLayout("slab");
  env_.Set("TIERMEM_PREFETCH_BYTES", "100%");
  Open(30 * kMiB, 96 * kMiB, 2);
  std::vector<tm_tensor> fill;
  const uint64_t sizes[] = {8 * kMiB, 12 * kMiB, 6 * kMiB, 4 * kMiB};
  for (int i = 0; i < 4; ++i) {
    fill.push_back(Make(sizes[i], ("fill" + std::to_string(i)).c_str()));
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, fill[i], TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
        << tm_last_error();
  }
  for (int i : {1, 2}) {
    ASSERT_EQ(tm_tensor_release(rt_, fill[i], TM_TIER_HBM), TM_OK);
    ASSERT_EQ(tm_tensor_destroy(rt_, fill[i]), TM_OK);
  }
  {
    // The precondition, whatever the placement: the holes are apart (no 13 MiB hole).
    tm_tensor probe = Make(13 * kMiB, "probe");
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, probe, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p),
              TM_ERR_OUT_OF_MEMORY)
        << "the 12 and 6 MiB holes are side by side";
    ASSERT_EQ(tm_tensor_destroy(rt_, probe), TM_OK);
  }
  const auto ys = RandomBytes(8 * kMiB, 41);
  const int steps = 4;
  tm_stats before_last{};
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step == steps - 1) before_last = Stats();
    ASSERT_EQ(tm_step_begin(rt_), TM_OK);
    // Made anew each step, in DRAM: an offload of a y kept across steps would be superseded.
    tm_tensor y = Make(8 * kMiB, "y", TM_CLASS_OTHER, TM_TIER_DRAM);
    ASSERT_EQ(tm_tensor_write(rt_, y, 0, ys.data(), ys.size()), TM_OK);
    ASSERT_EQ(tm_tensor_sync(rt_, y), TM_OK) << "y's prefetch, if any, has run";
    uint32_t mask = 0;
    ASSERT_EQ(tm_tensor_residency(rt_, y, &mask), TM_OK);
    EXPECT_EQ(mask & TM_TIER_BIT(TM_TIER_HBM), 0u) << "y took the only hole f fits in";
    ASSERT_NO_FATAL_FAILURE(WriteFreshThenRead(*this, 10 * kMiB, y, ys));
    ASSERT_EQ(tm_step_end(rt_), TM_OK);
  }
  ASSERT_EQ(tm_runtime_sync(rt_), TM_OK);
  const tm_stats s = Stats();
  EXPECT_GE(s.prefetches_dropped_no_room, 1u) << "the replayed steps did try y's prefetch";
  EXPECT_EQ(
      s.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM] - before_last.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM],
      8 * kMiB)
      << "y crosses the link once a step";
  for (int i : {0, 3}) ASSERT_EQ(tm_tensor_release(rt_, fill[i], TM_TIER_HBM), TM_OK);
}

// The hole check comes before eviction: a prefetch it would drop evicts nothing first. HBM of
// 30 MiB holds, in address order, A (4 MiB, held for good), c (4, clean, used after y), a 10 MiB
// hole, B (4, held) and e (8, clean, unused). Each step makes a fresh f (10 MiB), then reads y
// (12, homed in DRAM). The bytes allow y's prefetch (22 reclaimable: y and f), but no hole fits
// y: its only window is c and the hole, and y there leaves f no 10 MiB hole anywhere. So the
// prefetch is dropped, and c stays, where it used to be dropped first for nothing. (Each step's
// demand for y takes c's room; after the step c is read back into the 14 MiB run that A and B
// bound, at its front, so every step starts from the same layout.)
TEST_F(PressureApi, PrefetchTheHoleCheckDropsEvictsNothingFirst) {
  UseLayout("slab");
  env_.Set("TIERMEM_PREFETCH_BYTES", "100%");
  Open(30 * kMiB, 96 * kMiB, 2);
  auto resident = [&](tm_tensor t) {
    uint32_t mask = 0;
    EXPECT_EQ(tm_tensor_residency(rt_, t, &mask), TM_OK);
    return (mask & TM_TIER_BIT(TM_TIER_HBM)) != 0;
  };
  auto in_dram = [&](uint64_t bytes, const char* name, uint64_t seed) {
    const tm_tensor t = Make(bytes, name, TM_CLASS_OTHER, TM_TIER_DRAM);
    const auto data = RandomBytes(bytes, seed);
    EXPECT_EQ(tm_tensor_write(rt_, t, 0, data.data(), data.size()), TM_OK);
    return t;
  };
  // Placement puts a copy's leftover next to the neighbour that frees sooner; the order below
  // makes the layout of the comment, and the addresses check it.
  char* at[4] = {};
  auto acquire = [&](tm_tensor t, tm_access access, char** p) {
    void* q = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, access, nullptr, &q), TM_OK)
        << tm_last_error();
    *p = static_cast<char*>(q);
  };
  const tm_tensor a = in_dram(4 * kMiB, "A", 51);
  acquire(a, TM_ACCESS_READ, &at[0]);
  ASSERT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);
  const tm_tensor e = in_dram(8 * kMiB, "e", 52);
  acquire(e, TM_ACCESS_READ, &at[3]);
  const tm_tensor b = Make(4 * kMiB, "B");
  acquire(b, TM_ACCESS_WRITE, &at[2]);
  const tm_tensor x = Make(10 * kMiB, "X");
  char* unused = nullptr;
  void* p = nullptr;
  acquire(x, TM_ACCESS_WRITE, &unused);
  const tm_tensor c = in_dram(4 * kMiB, "c", 53);
  acquire(c, TM_ACCESS_READ, &at[1]);
  ASSERT_EQ(tm_tensor_release(rt_, c, TM_TIER_HBM), TM_OK);
  acquire(a, TM_ACCESS_READ, &at[0]);  // held for good from here
  ASSERT_EQ(tm_tensor_release(rt_, e, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_release(rt_, x, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_destroy(rt_, x), TM_OK);
  ASSERT_EQ(at[1] - at[0], static_cast<ptrdiff_t>(4 * kMiB)) << "c right after A";
  ASSERT_EQ(at[2] - at[0], static_cast<ptrdiff_t>(18 * kMiB)) << "B after c and 10 MiB";
  ASSERT_EQ(at[3] - at[0], static_cast<ptrdiff_t>(22 * kMiB)) << "e right after B";
  const auto ys = RandomBytes(12 * kMiB, 54), cs = RandomBytes(4 * kMiB, 53);
  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_TRUE(resident(c) && resident(e)) << "the layout of the comment above";
    ASSERT_EQ(tm_step_begin(rt_), TM_OK);
    const tm_stats before = Stats();
    tm_tensor y = Make(12 * kMiB, "y", TM_CLASS_OTHER, TM_TIER_DRAM);
    ASSERT_EQ(tm_tensor_write(rt_, y, 0, ys.data(), ys.size()), TM_OK);
    ASSERT_EQ(tm_tensor_sync(rt_, y), TM_OK) << "y's prefetch, if any, has run";
    if (step > 0) {
      EXPECT_GT(Stats().prefetches_dropped_no_room, before.prefetches_dropped_no_room)
          << "the replayed step tried y's prefetch, and dropped it";
      EXPECT_FALSE(resident(y));
      EXPECT_TRUE(resident(c)) << "c was evicted for a prefetch that was then dropped";
    }
    ASSERT_NO_FATAL_FAILURE(WriteFreshThenRead(*this, 10 * kMiB, y, ys));
    ASSERT_EQ(tm_step_end(rt_), TM_OK);
    ASSERT_EQ(tm_runtime_sync(rt_), TM_OK);
    // Outside the step, so that no replayed prefetch of c takes e's room for it.
    ASSERT_EQ(tm_tensor_acquire(rt_, c, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
        << tm_last_error();
    EXPECT_EQ(p, at[1]) << "c back in its place";
    EXPECT_EQ(std::memcmp(p, cs.data(), cs.size()), 0);
    ASSERT_EQ(tm_tensor_release(rt_, c, TM_TIER_HBM), TM_OK);
  }
  for (tm_tensor held : {a, b}) ASSERT_EQ(tm_tensor_release(rt_, held, TM_TIER_HBM), TM_OK);
}

}  // namespace
}  // namespace tiermem
