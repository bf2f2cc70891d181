// tm_tensor_create_copy_in_async: a framework's pack of a saved tensor in one call, with the
// semantics of the three calls it stands for (create, copy_in_async, copy_done), and no tensor
// left behind by a failure. A copy gate (io/copy_gate.h) holds a copy so that it is seen in
// flight: the C API is linked into the test program, so that the gate reaches its runtime.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/copy_gate.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

constexpr uint64_t kBytes = 4ull << 20;

tm_tensor_desc Desc(tm_tier home, const char* name, uint64_t bytes = kBytes) {
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = bytes;
  d.home_tier = home;
  d.cls = TM_CLASS_ACTIVATION;
  d.name = name;
  return d;
}

uint64_t Tensors(tm_runtime rt) {
  tm_stats s = TM_STATS_INIT;
  EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK) << tm_last_error();
  return s.tensors;
}

class CreateCopyIn : public ::testing::Test {
 protected:
  void SetUp() override {
    tm_config c = testing::SmallConfig(dir_.path());
    c.device = TM_DEVICE_EMULATED;
    c.prefetch_depth = 0;
    TM_ASSERT_OK(tm_runtime_create(&c, &rt_));
  }
  void TearDown() override { EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK); }
  int32_t Done(tm_tensor t) {
    int32_t done = -1;
    EXPECT_EQ(tm_tensor_copy_done(rt_, t, &done), TM_OK) << tm_last_error();
    return done;
  }
  testing::TempDir dir_;
  tm_runtime rt_{0};
};

// Host memory into DRAM without a stream: made and filled before the call returns (done 1), of
// the desc's size and name.
TEST_F(CreateCopyIn, HostSourceIsCopiedAndDoneOnReturn) {
  auto pattern = testing::RandomBytes(kBytes, 11);
  tm_tensor_desc d = Desc(TM_TIER_DRAM, "saved.0");
  tm_tensor t{0};
  int32_t done = -1;
  TM_ASSERT_OK(tm_tensor_create_copy_in_async(rt_, &d, pattern.data(), nullptr, &t, &done));
  EXPECT_NE(t.bits, 0u);
  EXPECT_EQ(done, 1);
  uint64_t bytes = 0;
  TM_ASSERT_OK(tm_tensor_bytes(rt_, t, &bytes));
  EXPECT_EQ(bytes, kBytes);
  uint32_t mask = 0;
  TM_ASSERT_OK(tm_tensor_residency(rt_, t, &mask));
  EXPECT_EQ(mask, TM_TIER_BIT(TM_TIER_DRAM));
  std::vector<uint8_t> back(kBytes);
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), kBytes));
  EXPECT_TRUE(back == pattern);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

// Device memory (an acquired HBM copy) into DRAM: the call returns with the copy on the link
// (done 0), tm_tensor_copy_done turns to 1 once it has landed, and the bytes are exact.
TEST_F(CreateCopyIn, DeviceSourceIsInFlightThenDone) {
  auto pattern = testing::RandomBytes(kBytes, 12);
  tm_tensor_desc sd = Desc(TM_TIER_HBM, "activation");
  tm_tensor src{0};
  TM_ASSERT_OK(tm_tensor_create(rt_, &sd, &src));
  TM_ASSERT_OK(tm_tensor_write(rt_, src, 0, pattern.data(), kBytes));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, src, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  tm_tensor_desc d = Desc(TM_TIER_DRAM, "saved.0");
  tm_tensor t{0};
  int32_t done = -1;
  {
    io::CopyGate gate(io::CopyGate::Match().Of(io::CopyDirection::kDeviceToHost).AtLeast(kBytes));
    TM_ASSERT_OK(tm_tensor_create_copy_in_async(rt_, &d, p, nullptr, &t, &done));
    ASSERT_TRUE(gate.WaitHeld());
    EXPECT_EQ(done, 0) << "the copy is held: it cannot have landed";
    EXPECT_EQ(Done(t), 0);
    gate.Open();
    ASSERT_TRUE(gate.WaitCompleted(1));
  }
  EXPECT_EQ(Done(t), 1) << "landed, without a sync";
  std::vector<uint8_t> back(kBytes);
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), kBytes));
  EXPECT_TRUE(back == pattern);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
  TM_ASSERT_OK(tm_tensor_release(rt_, src, TM_TIER_HBM));
  TM_ASSERT_OK(tm_tensor_destroy(rt_, src));
}

// Bad arguments: a status and a message naming what was wrong, *out zero, *done 0, and no
// tensor left behind.
TEST_F(CreateCopyIn, BadArgumentsLeaveNoTensor) {
  const uint64_t before = Tensors(rt_);
  std::vector<uint8_t> buf(kBytes);
  tm_tensor_desc d = Desc(TM_TIER_DRAM, "saved.0");
  tm_tensor t{123};
  int32_t done = 7;
  EXPECT_EQ(tm_tensor_create_copy_in_async(rt_, &d, nullptr, nullptr, &t, &done),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(tm_last_error(), "src"), nullptr) << tm_last_error();
  EXPECT_EQ(t.bits, 0u);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(tm_tensor_create_copy_in_async(rt_, nullptr, buf.data(), nullptr, &t, &done),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(tm_last_error(), "desc"), nullptr) << tm_last_error();
  EXPECT_EQ(tm_tensor_create_copy_in_async(rt_, &d, buf.data(), nullptr, nullptr, &done),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(tm_last_error(), "out"), nullptr) << tm_last_error();
  EXPECT_EQ(tm_tensor_create_copy_in_async(rt_, &d, buf.data(), nullptr, &t, nullptr),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(tm_last_error(), "done"), nullptr) << tm_last_error();
  tm_tensor_desc bad = d;
  bad.struct_size = 4;
  EXPECT_EQ(tm_tensor_create_copy_in_async(rt_, &bad, buf.data(), nullptr, &t, &done),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(tm_last_error(), "struct_size"), nullptr) << tm_last_error();
  tm_tensor_desc empty = Desc(TM_TIER_DRAM, "saved.0", 0);
  EXPECT_EQ(tm_tensor_create_copy_in_async(rt_, &empty, buf.data(), nullptr, &t, &done),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_create_copy_in_async(tm_runtime{0}, &d, buf.data(), nullptr, &t, &done),
            TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(t.bits, 0u);
  EXPECT_EQ(Tensors(rt_), before);
}

// The tensor can be created but its copy finds no room (DRAM pinned full, NVMe full): the
// tensor made for it is destroyed again, and what was there is untouched.
TEST(CreateCopyInNoRoom, FailedCopyLeavesNoTensor) {
  constexpr uint64_t kHalf = kBytes / 2;
  testing::TempDir dir;
  tm_config c = testing::SmallConfig(dir.path());
  c.device = TM_DEVICE_EMULATED;
  c.hbm_bytes = c.dram_bytes = kBytes;  // DRAM keeps part for staging: one kHalf fits, not two
  c.nvme_bytes = kHalf;
  c.prefetch_depth = 0;
  tm_runtime rt{0};
  TM_ASSERT_OK(tm_runtime_create(&c, &rt));
  auto pattern = testing::RandomBytes(kHalf, 14);
  // DRAM: one tensor, pinned by an acquire. NVMe: another, written there directly.
  tm_tensor_desc ad = Desc(TM_TIER_DRAM, "pinned", kHalf);
  tm_tensor a{0}, b{0};
  TM_ASSERT_OK(tm_tensor_create(rt, &ad, &a));
  TM_ASSERT_OK(tm_tensor_write(rt, a, 0, pattern.data(), kHalf));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt, a, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  tm_tensor_desc bd = Desc(TM_TIER_NVME, "on-nvme", kHalf);
  TM_ASSERT_OK(tm_tensor_create(rt, &bd, &b));
  TM_ASSERT_OK(tm_tensor_write(rt, b, 0, pattern.data(), kHalf));
  ASSERT_EQ(Tensors(rt), 2u);

  tm_tensor_desc d = Desc(TM_TIER_DRAM, "saved.0", kHalf);
  tm_tensor t{123};
  int32_t done = 7;
  const tm_status s = tm_tensor_create_copy_in_async(rt, &d, pattern.data(), nullptr, &t, &done);
  EXPECT_TRUE(s == TM_ERR_OUT_OF_MEMORY || s == TM_ERR_NO_SPACE)
      << tm_status_string(s) << ": " << tm_last_error();
  EXPECT_NE(tm_last_error()[0], 0);
  EXPECT_EQ(t.bits, 0u);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(Tensors(rt), 2u) << "the tensor made for the failed copy is left behind";
  std::vector<uint8_t> back(kHalf);
  TM_ASSERT_OK(tm_tensor_read(rt, b, 0, back.data(), kHalf));
  EXPECT_TRUE(back == pattern);
  EXPECT_EQ(std::memcmp(p, pattern.data(), kHalf), 0);
  TM_ASSERT_OK(tm_tensor_release(rt, a, TM_TIER_DRAM));
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

}  // namespace
}  // namespace tiermem
