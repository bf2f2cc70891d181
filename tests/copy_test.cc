// tm_tensor_copy_in / tm_tensor_copy_out through the C API: sizes from 1 byte to 64 MiB + 7 at
// odd offsets, through DRAM and NVMe homes, on both I/O engines, bit-exact, with HBM untouched;
// device memory (the emulated device's) straight to and from DRAM; bad ranges and pointers;
// concurrent copies of one tensor. Stream ordering is in tests/stream_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

// Exclusive tiers (TIERMEM_DRAM_INCLUSIVE=off) for every runtime of this file: its tests reach
// NVMe itself, for which inclusive DRAM's clean copies would stand in (tests/inclusive_test.cc).
static const tiermem::testing::ScopedEnv kExclusiveTiers("TIERMEM_DRAM_INCLUSIVE", "off");

namespace tiermem {
namespace {

using testing::RandomBytes;

struct Case {
  tm_io_engine engine;
  tm_tier home;
};

class CopyInOut : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    tm_config c = testing::SmallConfig(dir_.path(), GetParam().engine);
    c.hbm_bytes = 32ull << 20;
    c.dram_bytes = 200ull << 20;
    c.nvme_bytes = 512ull << 20;
    c.prefetch_depth = 0;
    TM_ASSERT_OK(tm_runtime_create(&c, &rt_));
  }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK);
    }
  }
  tm_tensor Make(uint64_t bytes, const char* name) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.home_tier = GetParam().home;
    d.name = name;
    tm_tensor t{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  uint64_t HbmUsed() {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    return s.tiers[TM_TIER_HBM].used;
  }
  testing::TempDir dir_;
  tm_runtime rt_{0};
};

TEST_P(CopyInOut, SizesAndOffsetsRoundTripBitExact) {
  const uint64_t sizes[] = {1, 7, 4096, 4097, (1u << 20) + 3, (9u << 20) + 1, (64ull << 20) + 7};
  uint64_t seed = 1;
  for (uint64_t n : sizes) {
    SCOPED_TRACE(n);
    tm_tensor t = Make(n, "t");
    auto whole = RandomBytes(n, seed++);
    TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 0, whole.data(), n, nullptr));
    TM_ASSERT_OK(tm_tensor_sync(rt_, t));
    // A part at an odd offset replaces just those bytes.
    const uint64_t off = n / 3, len = n - off - n / 5;
    auto part = RandomBytes(len, seed++);
    TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, off, part.data(), len, nullptr));
    std::memcpy(whole.data() + off, part.data(), len);
    std::vector<uint8_t> back(n, 0xcd);
    TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 0, back.data(), n, nullptr));
    TM_ASSERT_OK(tm_tensor_sync(rt_, t));
    ASSERT_TRUE(back == whole);
    // Out of NVMe (staged, pipelined) after an offload, at an offset.
    TM_ASSERT_OK(testing::OffloadNow(rt_, t, TM_TIER_NVME));
    uint32_t mask = 0;
    TM_ASSERT_OK(tm_tensor_residency(rt_, t, &mask));
    ASSERT_EQ(mask, TM_TIER_BIT(TM_TIER_NVME));
    std::vector<uint8_t> tail(n - off);
    TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, off, tail.data(), tail.size(), nullptr));
    TM_ASSERT_OK(tm_tensor_sync(rt_, t));
    ASSERT_EQ(0, std::memcmp(tail.data(), whole.data() + off, tail.size()));
    EXPECT_EQ(HbmUsed(), 0u) << "a DRAM/NVMe-homed tensor went through HBM";
    TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
  }
}

// Device memory (tiermem's own HBM copies of other tensors stand for a framework's buffers, on
// either device) goes straight to and from the DRAM copy: the tensor never takes HBM.
TEST_P(CopyInOut, DeviceMemoryGoesStraightToAndFromTheTier) {
  const uint64_t n = (3u << 20) + 5;
  auto make_hbm = [&](const char* name) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = n;
    d.home_tier = TM_TIER_HBM;
    d.name = name;
    tm_tensor b{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &b), TM_OK) << tm_last_error();
    return b;
  };
  tm_tensor in = make_hbm("framework-in"), out = make_hbm("framework-out");
  auto data = RandomBytes(n, 77);
  TM_ASSERT_OK(tm_tensor_write(rt_, in, 0, data.data(), n));
  void *src = nullptr, *dst = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, in, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &src));
  TM_ASSERT_OK(tm_tensor_acquire(rt_, out, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &dst));
  tm_tensor t = Make(n, "act");
  const uint64_t hbm_before = HbmUsed();
  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 0, src, n, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 0, dst, n, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  EXPECT_EQ(HbmUsed(), hbm_before) << "the tensor took HBM";
  TM_ASSERT_OK(tm_tensor_release(rt_, in, TM_TIER_HBM));
  TM_ASSERT_OK(tm_tensor_release(rt_, out, TM_TIER_HBM));
  std::vector<uint8_t> back(n);
  TM_ASSERT_OK(tm_tensor_read(rt_, out, 0, back.data(), n));
  EXPECT_TRUE(back == data);
  for (tm_tensor x : {in, out, t}) TM_ASSERT_OK(tm_tensor_destroy(rt_, x));
}

TEST_P(CopyInOut, BadRangesAndPointersAreRefused) {
  tm_tensor t = Make(100, "small");
  std::vector<uint8_t> buf(200, 1);
  EXPECT_EQ(tm_tensor_copy_in(rt_, t, 0, nullptr, 10, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("src is NULL"), std::string::npos);
  EXPECT_EQ(tm_tensor_copy_out(rt_, t, 0, nullptr, 10, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_copy_in(rt_, t, 90, buf.data(), 11, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("outside tensor \"small\""), std::string::npos);
  EXPECT_EQ(tm_tensor_copy_out(rt_, t, 101, buf.data(), 0, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_copy_out(rt_, t, UINT64_MAX, buf.data(), 2, nullptr),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_copy_in(rt_, t, 1, buf.data(), UINT64_MAX, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_copy_in(rt_, tm_tensor{12345}, 0, buf.data(), 1, nullptr),
            TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(tm_tensor_copy_in(tm_runtime{999}, t, 0, buf.data(), 1, nullptr),
            TM_ERR_INVALID_HANDLE);
  // Zero bytes is a no-op, even with NULL.
  EXPECT_EQ(tm_tensor_copy_in(rt_, t, 100, nullptr, 0, nullptr), TM_OK);
  // Never written: reads as zeros.
  std::vector<uint8_t> out(100, 9);
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 0, out.data(), 100, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  EXPECT_EQ(out, std::vector<uint8_t>(100, 0));
  // Acquired for writing: the acquired pointer is the way in.
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr, &p));
  EXPECT_EQ(tm_tensor_copy_in(rt_, t, 0, buf.data(), 100, nullptr), TM_ERR_BUSY);
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_DRAM));
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

// Threads copy whole patterns in and out of one tensor at once: every copy out holds exactly
// one pattern (copies of a tensor are serialized in call order, never torn).
TEST_P(CopyInOut, ConcurrentOverlappingCopiesAreNeverTorn) {
  const uint64_t n = (2u << 20) + 9;
  tm_tensor t = Make(n, "shared");
  constexpr int kThreads = 4;
  std::vector<std::vector<uint8_t>> patterns;
  for (int i = 0; i < kThreads; ++i) patterns.push_back(std::vector<uint8_t>(n, 0x10 + i));
  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 0, patterns[0].data(), n, nullptr));
  std::vector<std::thread> threads;
  std::vector<int> torn(kThreads, 0), failed(kThreads, 0);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::vector<uint8_t> out(n);
      for (int k = 0; k < 6; ++k) {
        if (tm_tensor_copy_in(rt_, t, 0, patterns[i].data(), n, nullptr) != TM_OK) ++failed[i];
        if (tm_tensor_copy_out(rt_, t, 0, out.data(), n, nullptr) != TM_OK ||
            tm_tensor_sync(rt_, t) != TM_OK) {
          ++failed[i];
          continue;
        }
        bool one = false;
        for (const auto& p : patterns) one |= out == p;
        torn[i] += !one;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(failed[i], 0) << "thread " << i;
    EXPECT_EQ(torn[i], 0) << "thread " << i;
  }
  TM_ASSERT_OK(tm_runtime_sync(rt_));
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

INSTANTIATE_TEST_SUITE_P(HomesAndEngines, CopyInOut,
                         ::testing::Values(Case{TM_IO_ENGINE_URING, TM_TIER_DRAM},
                                           Case{TM_IO_ENGINE_URING, TM_TIER_NVME},
                                           Case{TM_IO_ENGINE_POSIX, TM_TIER_DRAM},
                                           Case{TM_IO_ENGINE_POSIX, TM_TIER_NVME}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.engine == TM_IO_ENGINE_URING ? "uring"
                                                                                   : "posix") +
                                  "_" + tm_tier_name(i.param.home);
                         });

// A copy_out is a use in DRAM for the schedule: from the second step, the prefetch ahead of it
// brings the NVMe-resident tensors to DRAM.
TEST(CopyOut, IsAScheduledUse) {
  for (tm_io_engine engine : {TM_IO_ENGINE_URING, TM_IO_ENGINE_POSIX}) {
    SCOPED_TRACE(engine);
    testing::TempDir dir;
    tm_config c = testing::SmallConfig(dir.path(), engine);
    c.prefetch_depth = 2;
    tm_runtime rt{0};
    TM_ASSERT_OK(tm_runtime_create(&c, &rt));
    const uint64_t n = 1u << 20;
    std::vector<tm_tensor> ts;
    for (int i = 0; i < 4; ++i) {
      std::string name = "layer" + std::to_string(i);
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = n;
      d.home_tier = TM_TIER_NVME;
      d.name = name.c_str();
      tm_tensor t{0};
      TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
      auto data = RandomBytes(n, i);
      TM_ASSERT_OK(tm_tensor_copy_in(rt, t, 0, data.data(), n, nullptr));
      ts.push_back(t);
    }
    std::vector<uint8_t> out(n);
    for (int step = 0; step < 3; ++step) {
      TM_ASSERT_OK(tm_step_begin(rt));
      for (size_t i = 0; i < ts.size(); ++i) {
        TM_ASSERT_OK(tm_tensor_copy_out(rt, ts[i], 0, out.data(), n, nullptr));
        TM_ASSERT_OK(tm_tensor_sync(rt, ts[i]));
        ASSERT_TRUE(out == RandomBytes(n, i));
        TM_ASSERT_OK(tm_tensor_offload(rt, ts[i], TM_TIER_NVME));
      }
      TM_ASSERT_OK(tm_runtime_sync(rt));
      TM_ASSERT_OK(tm_step_end(rt));
    }
    tm_stats s = TM_STATS_INIT;
    TM_ASSERT_OK(tm_runtime_stats(rt, &s));
    EXPECT_GT(s.prefetches, 0u);
    EXPECT_GT(s.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM], 0u);
    TM_ASSERT_OK(tm_runtime_destroy(rt));
  }
}

// A DRAM-homed tensor larger than the whole DRAM tier (a 32 MiB activation beside a small DRAM
// budget, as offload_bench's NVMe run met on a GPU) is written on NVMe through staging rather
// than refused; it reads back bit-exact.
TEST(CopyIn, LargerThanDramGoesToNvme) {
  testing::TempDir dir;
  tm_config c = testing::SmallConfig(dir.path());
  c.dram_bytes = 16ull << 20;
  tm_runtime rt{0};
  TM_ASSERT_OK(tm_runtime_create(&c, &rt));
  const uint64_t n = (32ull << 20) + 3;
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = n;
  d.home_tier = TM_TIER_DRAM;
  d.name = "big";
  tm_tensor t{0};
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  auto data = RandomBytes(n, 5);
  TM_ASSERT_OK(tm_tensor_copy_in(rt, t, 0, data.data(), n, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt, t));
  uint32_t mask = 0;
  TM_ASSERT_OK(tm_tensor_residency(rt, t, &mask));
  EXPECT_EQ(mask, TM_TIER_BIT(TM_TIER_NVME));
  std::vector<uint8_t> back(n);
  TM_ASSERT_OK(tm_tensor_copy_out(rt, t, 0, back.data(), n, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt, t));
  EXPECT_TRUE(back == data);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

}  // namespace
}  // namespace tiermem
