// tm_tensor_copy_in_async and tm_tensor_copy_done: a copy out of a caller's stream's memory that
// the stream does not wait for, and the query that tells the caller when its source may be
// reused. The emulated link is capped so that a copy takes long enough to be seen in flight.
// The stream cases drive the runtime's C++ API (the emulated streams must be the library's own,
// as in tests/stream_test.cc); the rest drive the C API.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "io/device.h"
#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBytes = 4ull << 20;
constexpr double kLinkGbps = 0.05;  // 4 MiB cross the link in about 84 ms
constexpr auto kPatience = std::chrono::seconds(20);

class CopyInAsync : public ::testing::Test {
 protected:
  std::unique_ptr<Runtime> Make() {
    ConfigOverrides o;
    o.device = DeviceKind::kEmulated;
    o.hbm_bytes = SizeSetting{32ull << 20, 0};
    o.dram_bytes = SizeSetting{64ull << 20, 0};
    o.nvme_bytes = SizeSetting{64ull << 20, 0};
    o.nvme_paths = dir_.path();
    o.prefetch_depth = 0;
    o.emu_link_gbps = kLinkGbps;
    auto cfg = LoadConfig(o, [](const char*) { return std::optional<std::string>(); }, {});
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    auto rt = Runtime::Create(*cfg);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return rt.ok() ? std::move(*rt) : nullptr;
  }
  uint64_t Tensor(Runtime& rt, int home, const char* name) {
    TensorDesc d;
    d.bytes = kBytes;
    d.home_tier = home;
    d.name = name;
    auto h = rt.CreateTensor(d);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : 0;
  }
  // Device memory of the emulated device holding `pattern`: a tensor acquired in HBM, as a
  // framework's activation lives in GPU memory.
  char* DeviceSource(Runtime& rt, const std::vector<uint8_t>& pattern) {
    src_ = Tensor(rt, TM_TIER_HBM, "activation");
    EXPECT_TRUE(rt.Write(src_, 0, pattern.data(), kBytes).ok());
    auto p = rt.Acquire(src_, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(rt.device().IsDevicePointer(*p));
    return static_cast<char*>(*p);
  }
  static bool WaitDone(Runtime& rt, uint64_t t) {
    const auto deadline = Clock::now() + kPatience;
    while (Clock::now() < deadline) {
      auto done = rt.CopyDone(t);
      if (!done.ok()) return false;
      if (*done) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  // Whether the stream's work queued after the copy_in ran before the copy had landed.
  bool StreamRanAhead(bool stream_waits) {
    auto rt = Make();
    if (rt == nullptr) return false;
    auto pattern = testing::RandomBytes(kBytes, stream_waits ? 3 : 4);
    char* src = DeviceSource(*rt, pattern);
    const uint64_t dst = Tensor(*rt, TM_TIER_DRAM, "saved");
    EXPECT_TRUE(rt->CopyIn(dst, 0, src, kBytes, &stream_, stream_waits).ok());
    bool copy_done_when_stream_ran = true;
    stream_.Launch([&] {
      auto done = rt->CopyDone(dst);
      copy_done_when_stream_ran = done.ok() && *done;
    });
    stream_.Synchronize();
    EXPECT_TRUE(WaitDone(*rt, dst)) << "the copy never landed";
    std::vector<uint8_t> back(kBytes);
    EXPECT_TRUE(rt->Read(dst, 0, back.data(), kBytes).ok());
    EXPECT_TRUE(back == pattern);
    EXPECT_TRUE(rt->Release(src_, TM_TIER_HBM).ok());
    EXPECT_TRUE(rt->Sync(dst).ok());
    return !copy_done_when_stream_ran;
  }
  testing::TempDir dir_;
  io::EmulatedStream stream_;
  uint64_t src_ = 0;
};

// The point of the async mode: the caller's stream goes on while the D2H copy crosses the link;
// with tm_tensor_copy_in the same stream waits for it.
TEST_F(CopyInAsync, StreamDoesNotWaitForTheCopy) {
  EXPECT_TRUE(StreamRanAhead(/*stream_waits=*/false));
  EXPECT_FALSE(StreamRanAhead(/*stream_waits=*/true));
}

// A later copy_out of the same tensor is ordered after the async copy_in on the device: it
// reads the new bytes without the host waiting.
TEST_F(CopyInAsync, LaterCopyOutReadsTheNewBytes) {
  auto rt = Make();
  ASSERT_NE(rt, nullptr);
  auto pattern = testing::RandomBytes(kBytes, 5);
  char* src = DeviceSource(*rt, pattern);
  const uint64_t dst = Tensor(*rt, TM_TIER_DRAM, "saved");
  ASSERT_TRUE(rt->CopyIn(dst, 0, src, kBytes, &stream_, false).ok());
  std::vector<uint8_t> back(kBytes, 0);
  ASSERT_TRUE(rt->CopyOut(dst, 0, back.data(), kBytes, &stream_).ok());
  stream_.Synchronize();
  EXPECT_TRUE(back == pattern);
  ASSERT_TRUE(rt->Sync(dst).ok());
  ASSERT_TRUE(rt->Release(src_, TM_TIER_HBM).ok());
}

class CopyDoneApi : public ::testing::Test {
 protected:
  void SetUp() override {
    tm_config c = testing::SmallConfig(dir_.path());
    c.device = TM_DEVICE_EMULATED;
    c.emu_link_gbps = kLinkGbps;
    c.prefetch_depth = 0;
    TM_ASSERT_OK(tm_runtime_create(&c, &rt_));
  }
  void TearDown() override { EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK); }
  tm_tensor Make(tm_tier home, const char* name) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = kBytes;
    d.home_tier = home;
    d.name = name;
    tm_tensor t{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  int32_t Done(tm_tensor t) {
    int32_t done = -1;
    EXPECT_EQ(tm_tensor_copy_done(rt_, t, &done), TM_OK) << tm_last_error();
    return done;
  }
  testing::TempDir dir_;
  tm_runtime rt_{0};
};

// Device memory out through the C API without a stream: the call returns with the copy still on
// the link (done 0), the query turns to 1 once it has landed, and the bytes are exact.
TEST_F(CopyDoneApi, ReportsTheCopyInFlightThenDone) {
  auto pattern = testing::RandomBytes(kBytes, 6);
  tm_tensor src = Make(TM_TIER_HBM, "activation");
  TM_ASSERT_OK(tm_tensor_write(rt_, src, 0, pattern.data(), kBytes));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, src, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  tm_tensor dst = Make(TM_TIER_DRAM, "saved");
  TM_ASSERT_OK(tm_tensor_copy_in_async(rt_, dst, 0, p, kBytes, nullptr));
  EXPECT_EQ(Done(dst), 0) << "4 MiB at 0.05 GB/s cannot have landed yet";
  const auto deadline = Clock::now() + kPatience;
  while (Done(dst) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(Done(dst), 1);
  std::vector<uint8_t> back(kBytes);
  TM_ASSERT_OK(tm_tensor_read(rt_, dst, 0, back.data(), kBytes));
  EXPECT_TRUE(back == pattern);
  TM_ASSERT_OK(tm_tensor_sync(rt_, dst));
  // A copy_out into device memory is reported the same way.
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, dst, 0, p, kBytes, nullptr));
  EXPECT_EQ(Done(dst), 0);
  TM_ASSERT_OK(tm_tensor_sync(rt_, dst));
  EXPECT_EQ(Done(dst), 1);
  TM_ASSERT_OK(tm_tensor_release(rt_, src, TM_TIER_HBM));
}

// Host memory into a DRAM copy without a stream is copied before the call returns.
TEST_F(CopyDoneApi, HostSourceIsDoneOnReturn) {
  auto pattern = testing::RandomBytes(kBytes, 7);
  tm_tensor dst = Make(TM_TIER_DRAM, "saved");
  TM_ASSERT_OK(tm_tensor_copy_in_async(rt_, dst, 0, pattern.data(), kBytes, nullptr));
  EXPECT_EQ(Done(dst), 1);
  std::vector<uint8_t> back(kBytes);
  TM_ASSERT_OK(tm_tensor_read(rt_, dst, 0, back.data(), kBytes));
  EXPECT_TRUE(back == pattern);
}

TEST_F(CopyDoneApi, BadArgumentsAreReported) {
  tm_tensor t = Make(TM_TIER_DRAM, "t");
  EXPECT_EQ(tm_tensor_copy_done(rt_, t, nullptr), TM_ERR_INVALID_ARGUMENT);
  int32_t done = 7;
  EXPECT_EQ(tm_tensor_copy_done(rt_, tm_tensor{0}, &done), TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(tm_tensor_copy_in_async(rt_, t, 0, nullptr, 16, nullptr), TM_ERR_INVALID_ARGUMENT);
  char buf[16] = {0};
  EXPECT_EQ(tm_tensor_copy_in_async(rt_, t, kBytes - 8, buf, 16, nullptr), TM_ERR_INVALID_ARGUMENT);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
  EXPECT_EQ(tm_tensor_copy_done(rt_, t, &done), TM_ERR_INVALID_HANDLE);
}

}  // namespace
}  // namespace tiermem
