// Every C API function given NULL, zero, stale, foreign and out-of-range arguments: a clear
// status and message, never a crash.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::OffloadNow;
using testing::SmallConfig;
using testing::TempDir;

class ApiArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    tm_config cfg = SmallConfig(dir_.path());
    ASSERT_EQ(tm_runtime_create(&cfg, &rt_), TM_OK) << tm_last_error();
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 4096;
    ASSERT_EQ(tm_tensor_create(rt_, &d, &t_), TM_OK);
    ASSERT_EQ(tm_tensor_create(rt_, &d, &stale_), TM_OK);
    ASSERT_EQ(tm_tensor_destroy(rt_, stale_), TM_OK);
  }
  void TearDown() override { tm_runtime_destroy(rt_); }

  TempDir dir_;
  tm_runtime rt_{};
  tm_tensor t_{}, stale_{};
  const tm_runtime zero_rt_{0};
  const tm_tensor zero_t_{0};
  char buf_[8192] = {};
};

#define EXPECT_STATUS(expected, call)                                   \
  do {                                                                  \
    tm_status s_ = (call);                                              \
    EXPECT_EQ(s_, expected) << #call << " -> " << tm_status_string(s_); \
    if (s_ != TM_OK) {                                                  \
      EXPECT_STRNE(tm_last_error(), "") << #call;                       \
    }                                                                   \
  } while (0)

TEST_F(ApiArgs, Strings) {
  EXPECT_STREQ(tm_status_string(TM_OK), "TM_OK");
  EXPECT_STREQ(tm_status_string(TM_ERR_NO_SPACE), "TM_ERR_NO_SPACE");
  EXPECT_STREQ(tm_status_string(TM_STATUS_COUNT), "TM_STATUS_UNKNOWN");
  EXPECT_STREQ(tm_status_string(static_cast<tm_status>(-1)), "TM_STATUS_UNKNOWN");
  for (int i = 0; i < TM_STATUS_COUNT; ++i) {
    EXPECT_STRNE(tm_status_string(static_cast<tm_status>(i)), "TM_STATUS_UNKNOWN");
  }
  EXPECT_STREQ(tm_tier_name(TM_TIER_NVME), "nvme");
  EXPECT_STREQ(tm_tier_name(static_cast<tm_tier>(9)), "unknown");
  int major = -1, minor = -1, patch = -1;
  EXPECT_EQ(tm_get_version(&major, &minor, &patch), TM_OK);
  EXPECT_EQ(major, TM_VERSION_MAJOR);
  EXPECT_EQ(minor, TM_VERSION_MINOR);
  EXPECT_EQ(patch, TM_VERSION_PATCH);
  EXPECT_EQ(tm_get_version(nullptr, nullptr, nullptr), TM_OK);
  EXPECT_STREQ(tm_version_string(), "0.1.0");
}

// A caller built against a newer header passes a longer struct: whatever its tail holds (a
// newer setting, or zeros and padding), this library cannot read it, and refuses rather than
// ignore it. A tm_config of another major version is refused too.
TEST_F(ApiArgs, StructsFromANewerHeaderAreRefused) {
  struct Newer {
    tm_config config;
    uint64_t unknown;
  } newer{SmallConfig(dir_.path()), 0};
  newer.config.struct_size = sizeof newer;
  tm_runtime rt;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_create(&newer.config, &rt));
  std::string error = tm_last_error();
  EXPECT_NE(error.find("tm_config.struct_size is " + std::to_string(sizeof newer) +
                       ", more than the " + std::to_string(sizeof(tm_config)) + " bytes"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("newer tiermem.h"), std::string::npos) << error;
  // A size no header ever had: it ends inside a field (every sizeof is a multiple of the
  // struct's alignment).
  newer.config.struct_size = offsetof(tm_config, io_threads) + 1;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_create(&newer.config, &rt));
  EXPECT_NE(std::string(tm_last_error()).find("tm_config.struct_size is"), std::string::npos)
      << tm_last_error();
  newer.config.struct_size = sizeof(tm_config);
  ASSERT_EQ(tm_runtime_create(&newer.config, &rt), TM_OK) << tm_last_error();
  EXPECT_STATUS(TM_OK, tm_runtime_destroy(rt));

  tm_config other = SmallConfig(dir_.path());
  other.api_version = 10203;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_create(&other, &rt));
  error = tm_last_error();
  EXPECT_NE(error.find("tm_config.api_version is 10203 (tiermem 1.2.3)"), std::string::npos)
      << error;
  other.api_version = TM_VERSION + 1;  // a newer patch of the same major: accepted
  ASSERT_EQ(tm_runtime_create(&other, &rt), TM_OK) << tm_last_error();
  EXPECT_STATUS(TM_OK, tm_runtime_destroy(rt));

  tm_tensor_desc desc = TM_TENSOR_DESC_INIT;
  desc.bytes = 64;
  desc.struct_size = sizeof desc + 8;
  tm_tensor t;
  int32_t done = 0;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &desc, &t));
  EXPECT_NE(std::string(tm_last_error()).find("tm_tensor_desc.struct_size"), std::string::npos)
      << tm_last_error();
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_tensor_create_copy_in_async(rt_, &desc, buf_, nullptr, &t, &done));
  // A NULL desc too leaves *out zero and *done 0 (an outside client found them untouched).
  t.bits = 55;
  done = 7;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_tensor_create_copy_in_async(rt_, nullptr, buf_, nullptr, &t, &done));
  EXPECT_EQ(t.bits, 0u);
  EXPECT_EQ(done, 0);
  t.bits = 55;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, nullptr, &t));
  EXPECT_EQ(t.bits, 0u);

  tm_adam_config adam = TM_ADAM_CONFIG_INIT;
  adam.struct_size = sizeof adam + 8;
  tm_adam a;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_adam_create(rt_, &adam, &a));
  error = tm_last_error();
  EXPECT_NE(error.find("tm_adam_create: tm_adam_config.struct_size"), std::string::npos) << error;
}

TEST_F(ApiArgs, RuntimeCreateAndDestroy) {
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_create(nullptr, nullptr));
  tm_config bad = SmallConfig(dir_.path());
  bad.struct_size = 3;
  tm_runtime rt;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_create(&bad, &rt));
  EXPECT_NE(std::string(tm_last_error()).find("struct_size"), std::string::npos);
  bad = SmallConfig(dir_.path());
  bad.device = static_cast<tm_device_kind>(42);
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  bad = SmallConfig(dir_.path());
  bad.io_engine = static_cast<tm_io_engine>(42);
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  bad = SmallConfig(dir_.path());
  bad.numa_node = -7;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  bad = SmallConfig(dir_.path());
  bad.numa_node = 4000;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  EXPECT_NE(std::string(tm_last_error()).find("tm_config.numa_node=4000"), std::string::npos)
      << tm_last_error();
  bad = SmallConfig(dir_.path());
  bad.log_level = static_cast<tm_log_level>(9);
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  // DRAM: the staging ring at its smallest (128 KiB) and less than one granule beside it is no
  // tier at all (it was accepted with 0 bytes to hold a tensor); one granule beside it is one.
  bad = SmallConfig(dir_.path());
  bad.dram_bytes = (128 << 10) + 1024;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  EXPECT_NE(std::string(tm_last_error()).find("leaves no room beside the 128 KiB staging pool"),
            std::string::npos)
      << tm_last_error();
  bad.dram_bytes = (128 << 10) + (4 << 10);
  ASSERT_EQ(tm_runtime_create(&bad, &rt), TM_OK) << tm_last_error();
  tm_info info = TM_INFO_INIT;
  EXPECT_STATUS(TM_OK, tm_runtime_info(rt, &info));
  EXPECT_GT(info.tier_bytes[TM_TIER_DRAM], 0u);
  EXPECT_STATUS(TM_OK, tm_runtime_destroy(rt));
  bad = SmallConfig(dir_.path());
  bad.io_block_size = 1000;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));
  EXPECT_NE(std::string(tm_last_error()).find("tm_config.io_block_size"), std::string::npos);
  bad = SmallConfig(dir_.path());
  bad.cuda_device = -5;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&bad, &rt));

  // A caller built against an older header passes a smaller struct: only what it holds is read.
  tm_config old = SmallConfig(dir_.path());
  old.io_threads = 99;  // beyond the old struct: must not be read (99 would be rejected)
  old.struct_size = offsetof(tm_config, io_threads);
  tm_runtime old_rt;
  EXPECT_STATUS(TM_OK, tm_runtime_create(&old, &old_rt));
  EXPECT_STATUS(TM_OK, tm_runtime_destroy(old_rt));
  old.struct_size = sizeof old;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&old, &old_rt));
  EXPECT_NE(std::string(tm_last_error()).find("tm_config.io_threads"), std::string::npos);

  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_destroy(zero_rt_));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_destroy(tm_runtime{0xdeadbeef12345678ull}));
  tm_config cfg = SmallConfig(dir_.path());
  tm_runtime other;
  ASSERT_EQ(tm_runtime_create(&cfg, &other), TM_OK);
  EXPECT_STATUS(TM_OK, tm_runtime_destroy(other));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_destroy(other));  // twice
  tm_stats s = TM_STATS_INIT;
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_stats(other, &s));
}

// An NVMe budget that rounds down to nothing names its settings as the caller gave them: from
// the struct, the struct's fields (not the variables).
TEST_F(ApiArgs, NvmeBudgetOfNothingNamesTheFields) {
  tm_config c = SmallConfig(dir_.path());
  c.nvme_bytes = 4096;  // below one stripe (the block size)
  tm_runtime rt;
  EXPECT_STATUS(TM_ERR_CONFIG, tm_runtime_create(&c, &rt));
  const std::string error = tm_last_error();
  EXPECT_NE(error.find("tm_config.nvme_bytes=4KiB resolves to 0 bytes"), std::string::npos)
      << error;
  EXPECT_NE(error.find("(in whole stripes of 1048576 bytes: "), std::string::npos) << error;
  // A size is this rank's own: nothing about the file systems' size or ranks sharing it.
  EXPECT_EQ(error.find("shared by"), std::string::npos) << error;
}

TEST_F(ApiArgs, Stats) {
  tm_stats s = TM_STATS_INIT;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_stats(rt_, nullptr));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_stats(zero_rt_, &s));
  s.struct_size = 0;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_stats(rt_, &s));
  s = TM_STATS_INIT;
  EXPECT_STATUS(TM_OK, tm_runtime_stats(rt_, &s));
  EXPECT_EQ(s.tiers[TM_TIER_HBM].capacity, 96u << 20);
  EXPECT_EQ(s.tensors, 1u);
}

TEST_F(ApiArgs, ConfigValue) {
  size_t needed = 0;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_runtime_config_value(rt_, nullptr, buf_, 8, &needed));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_runtime_config_value(rt_, "TIERMEM_DEVICE", nullptr, 8, &needed));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_runtime_config_value(rt_, "TIERMEM_NOPE", buf_, 8, &needed));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_runtime_config_value(rt_, "TIERMEM_DEVICE", buf_, 3, &needed));
  EXPECT_EQ(needed, std::strlen("emulated") + 1);
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE,
                tm_runtime_config_value(zero_rt_, "TIERMEM_DEVICE", buf_, 64, &needed));
  EXPECT_STATUS(TM_OK, tm_runtime_config_value(rt_, "TIERMEM_DEVICE", buf_, 64, &needed));
  EXPECT_STREQ(buf_, "emulated");
  EXPECT_STATUS(TM_OK, tm_runtime_config_value(rt_, "TIERMEM_HBM_BYTES", buf_, 64, nullptr));
  EXPECT_STREQ(buf_, "96MiB");
}

TEST_F(ApiArgs, TensorCreate) {
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 10;
  tm_tensor t;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, nullptr, &t));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, nullptr));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_create(zero_rt_, &d, &t));
  EXPECT_EQ(t.bits, 0u);
  d.bytes = 0;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, &t));
  d.bytes = 10;
  d.cls = static_cast<tm_tensor_class>(77);
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, &t));
  d.cls = TM_CLASS_PARAM;
  d.home_tier = 5;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, &t));
  d.home_tier = TM_TIER_BY_PLACEMENT;
  d.struct_size = 1;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, &t));
  d.struct_size = sizeof d;
  EXPECT_STATUS(TM_OK, tm_tensor_create(rt_, &d, &t));
  EXPECT_NE(t.bits, 0u);
  // Too large for every tier (the largest, NVMe, holds 256 MiB here): it could never be placed.
  d.bytes = 1ull << 50;
  tm_tensor huge;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, &huge));
  EXPECT_NE(std::string(tm_last_error()).find("1125899906842624"), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(huge.bits, 0u);
  // As large as the largest tier: fine, and the first use of a smaller tier says why not there.
  d.bytes = 256ull << 20;
  EXPECT_STATUS(TM_OK, tm_tensor_create(rt_, &d, &huge));
  void* p;
  EXPECT_STATUS(TM_ERR_OUT_OF_MEMORY,
                tm_tensor_acquire(rt_, huge, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
}

// Sizes near 2^64 once rounded up to nothing in the allocator: create, acquire and write
// returned TM_OK and the bytes landed in the next tensor of the tier. Every such size is
// refused at create, naming the value, and no other tensor changes.
TEST_F(ApiArgs, TensorSizesNear2To64NeverAliasAnotherTensor) {
  auto before = testing::RandomBytes(4096, 7);
  ASSERT_EQ(tm_tensor_write(rt_, t_, 0, before.data(), before.size()), TM_OK) << tm_last_error();
  for (tm_tier home : {TM_TIER_HBM, TM_TIER_DRAM, TM_TIER_NVME}) {
    for (uint64_t bytes : {UINT64_MAX, UINT64_MAX - 255, UINT64_MAX - 4095, uint64_t{1} << 63,
                           (uint64_t{1} << 63) + 1}) {
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = bytes;
      d.home_tier = home;
      tm_tensor big{};
      EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_create(rt_, &d, &big));
      EXPECT_NE(std::string(tm_last_error()).find(std::to_string(bytes)), std::string::npos)
          << tm_last_error();
      EXPECT_EQ(big.bits, 0u);
      // Whatever a caller does with the handle it did not get is refused too.
      EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_write(rt_, big, 0, buf_, 16));
    }
  }
  // A neighbour created after the attempts sits beside t_, not on top of it.
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 4096;
  tm_tensor next;
  ASSERT_EQ(tm_tensor_create(rt_, &d, &next), TM_OK);
  std::memset(buf_, 0x5a, 4096);
  ASSERT_EQ(tm_tensor_write(rt_, next, 0, buf_, 4096), TM_OK) << tm_last_error();
  std::vector<uint8_t> back(4096);
  ASSERT_EQ(tm_tensor_read(rt_, t_, 0, back.data(), back.size()), TM_OK);
  EXPECT_EQ(back, before);
  tm_stats s = TM_STATS_INIT;
  ASSERT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
  EXPECT_EQ(s.tensors, 2u);
}

TEST_F(ApiArgs, TensorHandles) {
  uint64_t bytes = 0;
  uint32_t mask = 0;
  void* p = nullptr;
  for (tm_tensor bad :
       {zero_t_, stale_, tm_tensor{t_.bits + 1}, tm_tensor{t_.bits ^ (1ull << 40)}}) {
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_destroy(rt_, bad));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_bytes(rt_, bad, &bytes));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_write(rt_, bad, 0, buf_, 1));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_read(rt_, bad, 0, buf_, 1));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE,
                  tm_tensor_acquire(rt_, bad, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_release(rt_, bad, TM_TIER_HBM));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_offload(rt_, bad, TM_TIER_NVME));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_prefetch(rt_, bad, TM_TIER_HBM));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_sync(rt_, bad));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_residency(rt_, bad, &mask));
  }
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_sync(zero_rt_));
  // A good tensor through a bad runtime.
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_bytes(zero_rt_, t_, &bytes));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_destroy(zero_rt_, t_));
  // A tensor of another runtime.
  TempDir dir2;
  tm_config cfg = SmallConfig(dir2.path());
  tm_runtime other;
  ASSERT_EQ(tm_runtime_create(&cfg, &other), TM_OK);
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_bytes(other, t_, &bytes));
  tm_runtime_destroy(other);
  EXPECT_STATUS(TM_OK, tm_tensor_bytes(rt_, t_, &bytes));
  EXPECT_EQ(bytes, 4096u);
}

// Runtime and tensor handles once shared one numbering space (generation << 32 | slot), so a
// runtime handle passed as a tensor could name a live tensor. Each kind now carries its own
// tag in the top four bits (lib/base/handle.h): no handle of one kind is ever taken for the other.
TEST_F(ApiArgs, HandlesOfOneKindNeverNameTheOther) {
  constexpr uint64_t kKindBits = 0xFull << 60;
  std::vector<tm_tensor> tensors{t_};
  for (int i = 0; i < 64; ++i) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 64;
    tm_tensor t;
    ASSERT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK);
    tensors.push_back(t);
  }
  uint64_t bytes = 0;
  EXPECT_NE(rt_.bits & kKindBits, t_.bits & kKindBits);
  // The runtime's own handle, as a tensor of itself.
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_bytes(rt_, tm_tensor{rt_.bits}, &bytes));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_write(rt_, tm_tensor{rt_.bits}, 0, buf_, 1));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_destroy(rt_, tm_tensor{rt_.bits}));
  // ... and the message says what it is (it was "zero, destroyed or of another runtime").
  EXPECT_NE(std::string(tm_last_error()).find("is a runtime handle, passed where a tensor handle"),
            std::string::npos)
      << tm_last_error();
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_sync(tm_runtime{t_.bits}));
  EXPECT_NE(std::string(tm_last_error()).find("is a tensor handle, passed where a runtime handle"),
            std::string::npos)
      << tm_last_error();
  // (Run alone, this process's first runtime and first tensor have the same generation and
  // slot: with one numbering space their handles were equal, and the line above reached t_.)
  // Each tensor's handle, as a runtime.
  for (tm_tensor t : tensors) {
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_tensor_bytes(tm_runtime{t.bits}, t, &bytes));
    EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_destroy(tm_runtime{t.bits}));
    EXPECT_STATUS(TM_OK, tm_tensor_bytes(rt_, t, &bytes));
  }
  // Every handle of either kind carries a non-zero tag: no tagless value is ever valid.
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE,
                tm_tensor_bytes(rt_, tm_tensor{t_.bits & ~kKindBits}, &bytes));
  EXPECT_STATUS(TM_ERR_INVALID_HANDLE, tm_runtime_sync(tm_runtime{rt_.bits & ~kKindBits}));
  EXPECT_STATUS(TM_OK, tm_runtime_sync(rt_));
}

TEST_F(ApiArgs, NullOutputs) {
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_bytes(rt_, t_, nullptr));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_residency(rt_, t_, nullptr));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_tensor_acquire(rt_, t_, TM_TIER_HBM, TM_ACCESS_READ, nullptr, nullptr));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_write(rt_, t_, 0, nullptr, 1));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_read(rt_, t_, 0, nullptr, 1));
  EXPECT_STATUS(TM_OK, tm_tensor_write(rt_, t_, 0, nullptr, 0));  // nothing to copy
  EXPECT_STATUS(TM_OK, tm_tensor_read(rt_, t_, 0, nullptr, 0));
}

TEST_F(ApiArgs, OutOfRange) {
  void* p = nullptr;
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_write(rt_, t_, 4000, buf_, 100));
  EXPECT_NE(std::string(tm_last_error()).find("outside"), std::string::npos);
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_write(rt_, t_, 4097, buf_, 0));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_read(rt_, t_, 1, buf_, 4096));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_read(rt_, t_, UINT64_MAX, buf_, 2));  // overflow
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_tensor_acquire(rt_, t_, TM_TIER_NVME, TM_ACCESS_READ, nullptr, &p));
  EXPECT_NE(std::string(tm_last_error()).find("not nvme"), std::string::npos) << tm_last_error();
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_tensor_acquire(rt_, t_, static_cast<tm_tier>(7), TM_ACCESS_READ, nullptr, &p));
  EXPECT_NE(std::string(tm_last_error()).find("tier 7 is not a tier"), std::string::npos)
      << tm_last_error();
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_tensor_acquire(rt_, t_, TM_TIER_HBM, static_cast<tm_access>(9), nullptr, &p));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_release(rt_, t_, static_cast<tm_tier>(-1)));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_release(rt_, t_, TM_TIER_DRAM));  // not acquired
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_offload(rt_, t_, TM_TIER_HBM));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_offload(rt_, t_, static_cast<tm_tier>(3)));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_prefetch(rt_, t_, TM_TIER_NVME));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT, tm_tensor_prefetch(rt_, t_, static_cast<tm_tier>(-4)));
  EXPECT_STATUS(TM_ERR_INVALID_ARGUMENT,
                tm_schedule_set(rt_, &t_, nullptr, static_cast<size_t>(-1)));
  EXPECT_NE(std::string(tm_last_error()).find("count="), std::string::npos) << tm_last_error();
  EXPECT_STATUS(TM_OK, tm_tensor_sync(rt_, t_));
  EXPECT_STATUS(TM_OK, tm_runtime_sync(rt_));
  // The tensor is untouched by all of this.
  uint32_t mask = 1;
  EXPECT_STATUS(TM_OK, tm_tensor_residency(rt_, t_, &mask));
  EXPECT_EQ(mask, 0u);
}

// Many threads on one runtime: the calls are serialized safely and every byte is right.
TEST_F(ApiArgs, ThreadsShareARuntime) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = 256 << 10;
      tm_tensor t;
      if (tm_tensor_create(rt_, &d, &t) != TM_OK) ++failures;
      auto data = testing::RandomBytes(d.bytes, 100 + i);
      std::vector<uint8_t> back(d.bytes);
      for (int round = 0; round < 20; ++round) {
        if (tm_tensor_write(rt_, t, 0, data.data(), d.bytes) != TM_OK) ++failures;
        if (OffloadNow(rt_, t, round % 2 ? TM_TIER_NVME : TM_TIER_DRAM) != TM_OK) ++failures;
        if (tm_tensor_read(rt_, t, 0, back.data(), d.bytes) != TM_OK || back != data) ++failures;
      }
      if (tm_tensor_destroy(rt_, t) != TM_OK) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace tiermem
