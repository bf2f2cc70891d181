// The schedule under memory pressure: layers of parameters and activations with prefetch ahead
// never run out of memory; fresh tensors each step matched by name and by order; writes and
// reads as scheduled uses; an offload of a tensor read soon superseded only when it fits until
// that read.
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
using testing::RandomBytes;

constexpr uint64_t kMiB = 1 << 20;

// The loop the issue came from: parameters and activations of different sizes, an HBM budget
// of a few layers, prefetch ahead. Every write-acquire of an activation must succeed.
TEST_F(PressureApi, MixedSizesWithPrefetchNeverRunOutOfMemory) {
  for (int depth : {0, 1, 2, 4}) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    Open(40 * kMiB, 96 * kMiB, depth);
    const int layers = 6;
    std::vector<tm_tensor> params;
    std::vector<std::vector<uint8_t>> param_bytes;
    for (int l = 0; l < layers; ++l) {
      const uint64_t n = (7 + l % 3) * kMiB + 4097 * static_cast<uint64_t>(l);
      params.push_back(Make(n, ("w" + std::to_string(l)).c_str(), TM_CLASS_PARAM, TM_TIER_NVME));
      param_bytes.push_back(RandomBytes(n, static_cast<uint64_t>(l)));
      ASSERT_EQ(tm_tensor_write(rt_, params[l], 0, param_bytes[l].data(), n), TM_OK);
    }
    for (int step = 0; step < 4; ++step) {
      ASSERT_EQ(tm_step_begin(rt_), TM_OK);
      std::vector<tm_tensor> acts;
      for (int l = 0; l < layers; ++l) {  // forward
        void* p = nullptr;
        ASSERT_EQ(tm_tensor_acquire(rt_, params[l], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p),
                  TM_OK)
            << tm_last_error();
        ASSERT_EQ(std::memcmp(p, param_bytes[l].data(), param_bytes[l].size()), 0);
        ASSERT_EQ(tm_tensor_release(rt_, params[l], TM_TIER_HBM), TM_OK);
        const uint64_t n = (3 + l % 4) * kMiB + 513;
        acts.push_back(Make(n, ("a" + std::to_string(l)).c_str()));
        ASSERT_EQ(tm_tensor_acquire(rt_, acts[l], TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
            << tm_last_error();
        std::memset(p, l + 1, n);
        ASSERT_EQ(tm_tensor_release(rt_, acts[l], TM_TIER_HBM), TM_OK);
        ASSERT_EQ(tm_tensor_offload(rt_, acts[l], TM_TIER_NVME), TM_OK);
      }
      for (int l = layers; l-- > 0;) {  // backward
        void* p = nullptr;
        ASSERT_EQ(tm_tensor_acquire(rt_, params[l], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p),
                  TM_OK)
            << tm_last_error();
        ASSERT_EQ(tm_tensor_release(rt_, params[l], TM_TIER_HBM), TM_OK);
        ASSERT_EQ(tm_tensor_acquire(rt_, acts[l], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
            << tm_last_error();
        EXPECT_EQ(static_cast<uint8_t*>(p)[0], l + 1);
        ASSERT_EQ(tm_tensor_release(rt_, acts[l], TM_TIER_HBM), TM_OK);
        ASSERT_EQ(tm_tensor_destroy(rt_, acts[l]), TM_OK);
      }
      ASSERT_EQ(tm_step_end(rt_), TM_OK) << tm_last_error();
    }
    ASSERT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
    if (depth > 0) {
      EXPECT_GT(Stats().prefetches, 0u);
    }
    tm_runtime_destroy(rt_);
    rt_ = {};
  }
}

// Fresh tensors each step, matched by name: scheduled prefetches from step two on.
void FreshEachStep(PressureApi* test, tm_runtime rt, bool named, uint64_t* prefetches) {
  std::vector<tm_tensor> keep;
  for (int step = 0; step < 3; ++step) {
    ASSERT_EQ(tm_step_begin(rt), TM_OK);
    std::vector<tm_tensor> acts;
    for (int i = 0; i < 8; ++i) {
      const std::string name = "layer" + std::to_string(i) + ".out";
      acts.push_back(
          test->Make(4 * kMiB + 100 * static_cast<uint64_t>(i), named ? name.c_str() : nullptr));
      void* p = nullptr;
      ASSERT_EQ(tm_tensor_acquire(rt, acts[i], TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
          << tm_last_error();
      std::memset(p, i + 7, 4 * kMiB);
      ASSERT_EQ(tm_tensor_release(rt, acts[i], TM_TIER_HBM), TM_OK);
      ASSERT_EQ(testing::OffloadNow(rt, acts[i], TM_TIER_DRAM), TM_OK) << tm_last_error();
    }
    for (int i = 8; i-- > 0;) {
      void* p = nullptr;
      ASSERT_EQ(tm_tensor_acquire(rt, acts[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
          << tm_last_error();
      EXPECT_EQ(static_cast<uint8_t*>(p)[4 * kMiB - 1], i + 7);
      ASSERT_EQ(tm_tensor_release(rt, acts[i], TM_TIER_HBM), TM_OK);
      ASSERT_EQ(tm_tensor_destroy(rt, acts[i]), TM_OK);
    }
    ASSERT_EQ(tm_step_end(rt), TM_OK);
    tm_stats s = TM_STATS_INIT;
    ASSERT_EQ(tm_runtime_stats(rt, &s), TM_OK);
    prefetches[step] = s.prefetches;
  }
}

TEST_F(PressureApi, ScheduleReplaysFreshTensorsByName) {
  Open(64 * kMiB, 96 * kMiB, 2);
  uint64_t prefetches[3] = {};
  FreshEachStep(this, rt_, true, prefetches);
  EXPECT_EQ(prefetches[0], 0u);
  EXPECT_GT(prefetches[1], 0u) << "step two replays the schedule learned in step one";
  EXPECT_GT(prefetches[2], prefetches[1]);
  EXPECT_EQ(Stats().schedule_relearned, 0u);
}

TEST_F(PressureApi, ScheduleReplaysFreshUnnamedTensorsByOrder) {
  Open(64 * kMiB, 96 * kMiB, 2);
  uint64_t prefetches[3] = {};
  FreshEachStep(this, rt_, false, prefetches);
  EXPECT_EQ(prefetches[0], 0u);
  EXPECT_GT(prefetches[1], 0u);
  EXPECT_EQ(Stats().schedule_relearned, 0u);
}

// Writes and reads are uses: a framework that copies in and out gets a schedule too.
TEST_F(PressureApi, WritesAndReadsAreScheduledUses) {
  Open(64 * kMiB, 96 * kMiB, 2);
  std::vector<tm_tensor> ts;
  std::vector<uint8_t> buf(2 * kMiB, 1);
  for (int i = 0; i < 4; ++i) ts.push_back(Make(2 * kMiB, ("t" + std::to_string(i)).c_str()));
  for (int step = 0; step < 2; ++step) {
    ASSERT_EQ(tm_step_begin(rt_), TM_OK);
    for (auto t : ts) ASSERT_EQ(tm_tensor_write(rt_, t, 0, buf.data(), buf.size()), TM_OK);
    for (auto t : ts) ASSERT_EQ(tm_tensor_read(rt_, t, 0, buf.data(), buf.size()), TM_OK);
    ASSERT_EQ(tm_step_end(rt_), TM_OK);
  }
  EXPECT_EQ(Stats().schedule_length, 8u);
  EXPECT_EQ(Stats().schedule_relearned, 0u);
}

// An offload of a tensor the schedule reads within the prefetch stages is superseded (it would
// be read straight back) only when HBM can hold it beside everything used before that read.
// Three 5 MiB copies in 16 MiB of HBM and a fourth in DRAM: read in the order b, a, ... the
// offload of a is skipped (b + a fit); in the order b, c, d, a it runs (b + c + d + a do not:
// keeping a would make d's room come from a copy needed sooner).
class OffloadUsedSoon : public PressureApi, public ::testing::WithParamInterface<bool> {};

TEST_P(OffloadUsedSoon, IsSupersededOnlyWhenItFitsUntilItsRead) {
  const bool fits = GetParam();
  Open(16 * kMiB, 96 * kMiB, 2);
  tm_tensor a = Make(5 * kMiB, "a"), b = Make(5 * kMiB, "b"), c = Make(5 * kMiB, "c");
  for (tm_tensor h : {a, b, c}) {
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, h, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK);
    std::memset(p, 7, 5 * kMiB);
    ASSERT_EQ(tm_tensor_release(rt_, h, TM_TIER_HBM), TM_OK);
  }
  tm_tensor d = Make(5 * kMiB, "d", TM_CLASS_OTHER, TM_TIER_DRAM);
  std::vector<uint8_t> bytes(5 * kMiB, 9);
  ASSERT_EQ(tm_tensor_write(rt_, d, 0, bytes.data(), bytes.size()), TM_OK);
  const tm_tensor fitting[] = {b, a, c, d}, crowded[] = {b, c, d, a};
  ASSERT_EQ(tm_schedule_set(rt_, fits ? fitting : crowded, nullptr, 4), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_step_begin(rt_), TM_OK);
  ASSERT_EQ(tm_tensor_offload(rt_, a, TM_TIER_NVME), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
  uint32_t mask = 0;
  ASSERT_EQ(tm_tensor_residency(rt_, a, &mask), TM_OK);
  if (fits) {
    EXPECT_EQ(mask, TM_TIER_BIT(TM_TIER_HBM)) << "the offload of a was not superseded";
  } else {
    EXPECT_NE(mask & TM_TIER_BIT(TM_TIER_NVME), 0u) << "the offload of a did not run";
    EXPECT_EQ(mask & TM_TIER_BIT(TM_TIER_HBM), 0u);
  }
  std::vector<uint8_t> back(5 * kMiB);
  ASSERT_EQ(tm_tensor_read(rt_, a, 0, back.data(), back.size()), TM_OK);
  EXPECT_EQ(std::count(back.begin(), back.end(), 7), static_cast<long>(back.size()));
  ASSERT_EQ(tm_step_end(rt_), TM_OK);
}

INSTANTIATE_TEST_SUITE_P(PressureApi, OffloadUsedSoon, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Fits" : "Crowded";
                         });

}  // namespace
}  // namespace tiermem
