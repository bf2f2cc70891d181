// Callers' copies against the runtime's own work: syncs that wait for copies in flight, deferred
// frees after destroy, buffers that overlap the tensor's own copy (every caller-copy entry point),
// and an HBM budget below its granule. First found by an outside client driving the C API.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

class CallerCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    config_ = testing::SmallConfig(dir_.path());
    config_.device = TM_DEVICE_EMULATED;  // the host reads the HBM copies below
  }
  void Create() { TM_ASSERT_OK(tm_runtime_create(&config_, &rt_)); }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK);
    }
  }
  tm_tensor Tensor(uint64_t bytes, tm_tier home, const char* name = nullptr) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.home_tier = home;
    d.name = name;
    tm_tensor t{};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  tm_stats Stats() {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    return s;
  }

  testing::TempDir dir_;
  tm_config config_{};
  tm_runtime rt_{};
};

// docs/c-api.md, copy_out: "dst holds the bytes once tm_tensor_sync returns". With another thread
// calling tm_runtime_sync meanwhile, tm_tensor_sync of an HBM tensor returns TM_OK before the
// copy out of HBM has landed: the caller reads stale bytes (they arrive later).
TEST_F(CallerCopy, TensorSyncWaitsForCopyOutWhileAnotherThreadSyncsTheRuntime) {
  Create();
  constexpr uint64_t kBytes = 65536;
  tm_tensor t = Tensor(kBytes, TM_TIER_HBM, "mine");
  std::atomic<bool> stop{false};
  std::thread syncer([&] {
    while (!stop.load()) tm_runtime_sync(rt_);
  });
  std::vector<uint64_t> src(kBytes / 8), dst(kBytes / 8);
  int not_landed = 0, first_bad = 0;
  for (int it = 1; it <= 10000 && not_landed == 0; ++it) {
    std::fill(src.begin(), src.end(), static_cast<uint64_t>(it));
    ASSERT_EQ(tm_tensor_copy_in(rt_, t, 0, src.data(), kBytes, nullptr), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    std::fill(dst.begin(), dst.end(), ~0ull);
    ASSERT_EQ(tm_tensor_copy_out(rt_, t, 0, dst.data(), kBytes, nullptr), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    if (dst.front() != static_cast<uint64_t>(it) || dst.back() != static_cast<uint64_t>(it)) {
      ++not_landed;
      first_bad = it;
    }
  }
  stop = true;
  syncer.join();
  tm_runtime_sync(rt_);  // a late copy must land before dst goes away
  EXPECT_EQ(not_landed, 0) << "copy " << first_bad
                           << ": tm_tensor_sync returned TM_OK before copy_out wrote dst";
  EXPECT_EQ(tm_tensor_destroy(rt_, t), TM_OK);
}

// A tensor destroyed right after a copy_out from its HBM copy keeps that copy's memory: with
// every tensor destroyed and tm_runtime_sync returned, tiers[HBM].used stays above 0 until some
// later allocation needs the room.
TEST_F(CallerCopy, DestroyAfterCopyOutFreesTheHbmCopyBySync) {
  Create();
  std::vector<uint8_t> src = testing::RandomBytes(100000, 1), dst(100000);
  for (int i = 0; i < 20; ++i) {
    tm_tensor t = Tensor(src.size(), TM_TIER_HBM);
    ASSERT_EQ(tm_tensor_write(rt_, t, 0, src.data(), src.size()), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_copy_out(rt_, t, 0, dst.data(), dst.size(), nullptr), TM_OK)
        << tm_last_error();
    ASSERT_EQ(tm_tensor_destroy(rt_, t), TM_OK) << tm_last_error();
  }
  ASSERT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
  tm_stats s = Stats();
  EXPECT_EQ(s.tensors, 0u);
  EXPECT_EQ(s.tiers[TM_TIER_HBM].used, 0u) << "bytes of destroyed tensors still counted in HBM";
}

// Same with the framework's allocator: docs/c-api.md says the copy's memory goes back with
// device_free when its tensor is destroyed (once nothing uses it). After every tensor is
// destroyed and tm_runtime_sync returned, part of it is still held from the framework.
std::atomic<int64_t> g_outstanding{0};
void* CountingAlloc(void*, size_t bytes, int32_t, void*) {
  g_outstanding += static_cast<int64_t>(bytes);
  return malloc(bytes);
}
void CountingFree(void*, void* ptr, size_t bytes, int32_t, void*) {
  g_outstanding -= static_cast<int64_t>(bytes);
  free(ptr);
}

TEST_F(CallerCopy, DeviceFreeComesBySyncAfterReleaseOnStreamAndDestroy) {
  g_outstanding = 0;
  config_.device_alloc = CountingAlloc;
  config_.device_free = CountingFree;
  Create();
  std::vector<uint8_t> src = testing::RandomBytes(100000, 2);
  for (int i = 0; i < 20; ++i) {
    tm_tensor t = Tensor(src.size(), TM_TIER_HBM);
    ASSERT_EQ(tm_tensor_write(rt_, t, 0, src.data(), src.size()), TM_OK) << tm_last_error();
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
    // 0x1: the emulated device's default stream, with no work queued on it.
    ASSERT_EQ(tm_tensor_release_on_stream(rt_, t, TM_TIER_HBM, reinterpret_cast<void*>(1)), TM_OK)
        << tm_last_error();
    ASSERT_EQ(tm_tensor_destroy(rt_, t), TM_OK) << tm_last_error();
  }
  ASSERT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
  EXPECT_EQ(g_outstanding.load(), 0) << "bytes of destroyed tensors not given back to device_free";
  EXPECT_EQ(Stats().tiers[TM_TIER_HBM].used, 0u);
  ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
  rt_ = {};
  EXPECT_EQ(g_outstanding.load(), 0);
}

// A budget that rounds down to nothing is refused for a percentage ("resolves to 0 bytes") and
// for DRAM, but TIERMEM_HBM_BYTES of 1 to 255 silently gives an HBM tier of 0 bytes (config_value
// still says "255"), where every HBM use fails.
TEST_F(CallerCopy, HbmBudgetBelowItsGranuleIsRefused) {
  config_.hbm_bytes = 255;
  tm_status s = tm_runtime_create(&config_, &rt_);
  if (s == TM_OK) {
    tm_info info = TM_INFO_INIT;
    ASSERT_EQ(tm_runtime_info(rt_, &info), TM_OK);
    EXPECT_GT(info.tier_bytes[TM_TIER_HBM], 0u) << "TIERMEM_HBM_BYTES=255 resolved to 0 bytes";
  } else {
    EXPECT_EQ(s, TM_ERR_CONFIG) << tm_last_error();
  }
}

// copy_in whose src overlaps the tensor's own copy (its DRAM copy, acquired for reading) must not
// be a memcpy of overlapping ranges inside tiermem (undefined behaviour; ASan:
// memcpy-param-overlap): refused, or copied as memmove would.
TEST_F(CallerCopy, CopyInFromTheTensorsOwnCopyOverlapping) {
  Create();
  constexpr uint64_t kBytes = 65536;
  tm_tensor t = Tensor(kBytes, TM_TIER_DRAM, "self");
  std::vector<uint8_t> src = testing::RandomBytes(kBytes, 3);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, src.data(), kBytes), TM_OK) << tm_last_error();
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  tm_status s = tm_tensor_copy_in(rt_, t, 1, p, 4096, nullptr);
  if (s == TM_OK) s = tm_tensor_sync(rt_, t);
  ASSERT_EQ(tm_tensor_release(rt_, t, TM_TIER_DRAM), TM_OK);
  if (s == TM_OK) {
    std::vector<uint8_t> want = src, got(kBytes);
    std::memmove(want.data() + 1, src.data(), 4096);
    ASSERT_EQ(tm_tensor_read(rt_, t, 0, got.data(), kBytes), TM_OK) << tm_last_error();
    EXPECT_EQ(got, want);
  } else {
    EXPECT_EQ(s, TM_ERR_INVALID_ARGUMENT) << tm_last_error();
  }
}

// tm_tensor_read into, and tm_tensor_write from, a buffer inside the tensor's own acquired DRAM
// copy: the same refusal as copy_in / copy_out (they are one path), never a memcpy of
// overlapping ranges.
TEST_F(CallerCopy, ReadAndWriteWithABufferOverlappingTheAcquiredCopyAreRefused) {
  Create();
  constexpr uint64_t kBytes = 65536;
  tm_tensor t = Tensor(kBytes, TM_TIER_DRAM, "self");
  const std::vector<uint8_t> src = testing::RandomBytes(kBytes, 4);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, src.data(), kBytes), TM_OK) << tm_last_error();
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  char* own = static_cast<char*>(p);
  EXPECT_EQ(tm_tensor_read(rt_, t, 0, own + 16, 4096), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("dst overlaps"), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(tm_tensor_write(rt_, t, 8, own, 4096), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("src overlaps"), std::string::npos)
      << tm_last_error();
  // A buffer beside the copy (not overlapping) still works, and the bytes are intact.
  std::vector<uint8_t> got(kBytes);
  EXPECT_EQ(tm_tensor_read(rt_, t, 0, got.data(), kBytes), TM_OK) << tm_last_error();
  EXPECT_EQ(got, src);
  ASSERT_EQ(tm_tensor_release(rt_, t, TM_TIER_DRAM), TM_OK);
  EXPECT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
}

}  // namespace
}  // namespace tiermem
