// tm_tensor_copy_in_async and tm_tensor_copy_done: a copy out of a caller's stream's memory that
// the stream does not wait for, and the query that tells the caller when its source may be
// reused. A copy gate (io/copy_gate.h) holds the copy so that it is seen in flight, and says
// when it has landed. The stream cases drive the runtime's C++ API (the emulated streams must be
// the library's own, as in tests/stream_test.cc); the rest drive the C API, linked into the test
// program so that the gate reaches its runtime.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/copy_gate.h"
#include "io/device.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using io::CopyGate;
using testing::NewTensor;
constexpr uint64_t kBytes = 4ull << 20;

// Holds the next copy out of device memory (kBytes) at its start.
CopyGate::Match DeviceToHost() {
  return CopyGate::Match().Of(io::CopyDirection::kDeviceToHost).AtLeast(kBytes);
}

class CopyInAsync : public ::testing::Test {
 protected:
  std::unique_ptr<Runtime> Make() {
    ConfigOverrides o = testing::Emulated(dir_.path(), 32ull << 20, 64ull << 20, 64ull << 20);
    o.prefetch_depth = 0;
    return testing::MakeRuntime(o);
  }
  // Device memory of the emulated device holding `pattern`: a tensor acquired in HBM, as a
  // framework's activation lives in GPU memory.
  char* DeviceSource(Runtime& rt, const std::vector<uint8_t>& pattern) {
    src_ = NewTensor(rt, "activation", kBytes, TM_TIER_HBM);
    EXPECT_TRUE(rt.Write(src_, 0, pattern.data(), kBytes).ok());
    auto p = rt.Acquire(src_, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(rt.device().IsDevicePointer(*p));
    return static_cast<char*>(*p);
  }
  // Whether the stream's work queued after the copy_in ran before the copy had landed. The
  // copy is held at its start while that work is queued: without waiting for the copy, the
  // stream runs it at once; waiting, it runs only once the gate has let the copy go and it has
  // landed.
  bool StreamRanAhead(bool stream_waits) {
    auto rt = Make();
    if (rt == nullptr) return false;
    auto pattern = testing::RandomBytes(kBytes, stream_waits ? 3 : 4);
    char* src = DeviceSource(*rt, pattern);
    const uint64_t dst = NewTensor(*rt, "saved", kBytes, TM_TIER_DRAM);
    CopyGate gate(DeviceToHost());
    EXPECT_TRUE(rt->CopyIn(dst, 0, src, kBytes, &stream_, stream_waits).ok());
    EXPECT_TRUE(gate.WaitHeld());
    bool copy_done_when_stream_ran = true;
    testing::Latch ran;
    stream_.Launch([&] {
      auto done = rt->CopyDone(dst);
      copy_done_when_stream_ran = done.ok() && *done;
      ran.Open();
    });
    // Not waiting, the stream gets there with the copy held; waiting, it cannot.
    if (!stream_waits) ran.Wait();
    gate.Open();
    stream_.Synchronize();
    EXPECT_TRUE(gate.WaitCompleted(1)) << "the copy never landed";
    EXPECT_FALSE(gate.expired());
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
// reads the new bytes, and the host does not wait for the copy_in (held meanwhile).
TEST_F(CopyInAsync, LaterCopyOutReadsTheNewBytes) {
  auto rt = Make();
  ASSERT_NE(rt, nullptr);
  auto pattern = testing::RandomBytes(kBytes, 5);
  char* src = DeviceSource(*rt, pattern);
  const uint64_t dst = NewTensor(*rt, "saved", kBytes, TM_TIER_DRAM);
  CopyGate gate(DeviceToHost());
  ASSERT_TRUE(rt->CopyIn(dst, 0, src, kBytes, &stream_, false).ok());
  ASSERT_TRUE(gate.WaitHeld());
  std::vector<uint8_t> back(kBytes, 0);
  ASSERT_TRUE(rt->CopyOut(dst, 0, back.data(), kBytes, &stream_).ok());
  gate.Open();
  EXPECT_FALSE(gate.expired()) << "the host waited for the copy_in";
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
// the link (done 0, held at its start), the query turns to 1 once it has landed, and the bytes
// are exact.
TEST_F(CopyDoneApi, ReportsTheCopyInFlightThenDone) {
  auto pattern = testing::RandomBytes(kBytes, 6);
  tm_tensor src = Make(TM_TIER_HBM, "activation");
  TM_ASSERT_OK(tm_tensor_write(rt_, src, 0, pattern.data(), kBytes));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, src, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  tm_tensor dst = Make(TM_TIER_DRAM, "saved");
  {
    CopyGate gate(DeviceToHost());
    TM_ASSERT_OK(tm_tensor_copy_in_async(rt_, dst, 0, p, kBytes, nullptr));
    ASSERT_TRUE(gate.WaitHeld());
    EXPECT_EQ(Done(dst), 0) << "the copy is held: it cannot have landed";
    gate.Open();
    ASSERT_TRUE(gate.WaitCompleted(1));
    EXPECT_EQ(Done(dst), 1) << "landed, without a sync";
  }
  std::vector<uint8_t> back(kBytes);
  TM_ASSERT_OK(tm_tensor_read(rt_, dst, 0, back.data(), kBytes));
  EXPECT_TRUE(back == pattern);
  TM_ASSERT_OK(tm_tensor_sync(rt_, dst));
  // A copy_out into device memory is reported the same way.
  {
    CopyGate gate(CopyGate::Match().Of(io::CopyDirection::kHostToDevice).AtLeast(kBytes));
    TM_ASSERT_OK(tm_tensor_copy_out(rt_, dst, 0, p, kBytes, nullptr));
    ASSERT_TRUE(gate.WaitHeld());
    EXPECT_EQ(Done(dst), 0);
  }
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
