// tm_tensor_acquire_dlpack: an acquired copy handed over as a DLPack DLManagedTensor whose deleter
// releases it; a destroy while exports are out that leaves the memory to the last deleter; the
// layouts DLPack cannot describe refused with nothing acquired.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

// DLPack's unversioned ABI, as a consumer reads it (the specification's layout).
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;
constexpr uint64_t kBytes = 64 * 128 * 4;

uint64_t Used(tm_runtime rt, tm_tier tier) {
  tm_stats s = TM_STATS_INIT;
  EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK) << tm_last_error();
  return s.tiers[tier].used;
}

uint64_t Tensors(tm_runtime rt) {
  tm_stats s = TM_STATS_INIT;
  EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK) << tm_last_error();
  return s.tensors;
}

class Dlpack : public ::testing::Test {
 protected:
  void SetUp() override {
    tm_config c = testing::SmallConfig(dir_.path());
    c.device = TM_DEVICE_EMULATED;
    c.prefetch_depth = 0;
    TM_ASSERT_OK(tm_runtime_create(&c, &rt_));
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = kBytes;
    d.home_tier = TM_TIER_DRAM;
    d.name = "saved.0";
    TM_ASSERT_OK(tm_tensor_create(rt_, &d, &t_));
    bytes_ = testing::RandomBytes(kBytes, 5);
    TM_ASSERT_OK(tm_tensor_write(rt_, t_, 0, bytes_.data(), kBytes));
  }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error();
    }
  }
  // A 64 x 128 float32 view (strides NULL: row-major) of the tensor's HBM copy.
  DLManagedTensor* Export(tm_tier tier = TM_TIER_HBM, const int64_t* strides = nullptr) {
    tm_dlpack_layout layout = TM_DLPACK_LAYOUT_INIT;
    layout.ndim = 2;
    layout.shape = shape_;
    layout.strides = strides;
    void* m = nullptr;
    EXPECT_EQ(tm_tensor_acquire_dlpack(rt_, t_, tier, TM_ACCESS_READ, nullptr, &layout, &m), TM_OK)
        << tm_last_error();
    return static_cast<DLManagedTensor*>(m);
  }
  testing::TempDir dir_;
  tm_runtime rt_{0};
  tm_tensor t_{0};
  std::vector<uint8_t> bytes_;
  int64_t shape_[2] = {64, 128};
};

// The export views the acquired copy with the given layout, on the host (the emulated device's
// HBM is host memory); its deleter releases it, so that a destroy then succeeds.
TEST_F(Dlpack, ViewsTheAcquiredCopyAndItsDeleterReleasesIt) {
  DLManagedTensor* m = Export();
  ASSERT_NE(m, nullptr);
  const DLTensor& t = m->dl_tensor;
  EXPECT_EQ(t.device.device_type, kDLCPU);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.dtype.code, 2);
  EXPECT_EQ(t.dtype.bits, 32);
  EXPECT_EQ(t.dtype.lanes, 1);
  EXPECT_EQ(t.shape[0], 64);
  EXPECT_EQ(t.shape[1], 128);
  EXPECT_EQ(t.strides[0], 128);  // row-major, filled in
  EXPECT_EQ(t.strides[1], 1);
  EXPECT_EQ(t.byte_offset, 0u);
  EXPECT_EQ(std::memcmp(t.data, bytes_.data(), kBytes), 0);
  uint32_t mask = 0;
  TM_ASSERT_OK(tm_tensor_residency(rt_, t_, &mask));
  EXPECT_TRUE(mask & (1u << TM_TIER_HBM));
  tm_stats s = TM_STATS_INIT;
  TM_ASSERT_OK(tm_runtime_stats(rt_, &s));
  EXPECT_EQ(s.dlpack_exports, 1u);
  EXPECT_EQ(tm_tensor_release(rt_, t_, TM_TIER_HBM), TM_ERR_INVALID_ARGUMENT)
      << "a plain release may not take an export's pin";
  EXPECT_NE(std::string(tm_last_error()).find("DLPack"), std::string::npos) << tm_last_error();
  m->deleter(m);
  TM_ASSERT_OK(tm_runtime_stats(rt_, &s));
  EXPECT_EQ(s.dlpack_exports, 0u);
  EXPECT_EQ(tm_tensor_release(rt_, t_, TM_TIER_HBM), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_OK) << tm_last_error();
}

// A destroy while only exports pin the tensor succeeds at once: the handle is gone, the copy the
// exports view stays (the other copies go) until the last deleter.
TEST_F(Dlpack, DestroyWhileExportedFreesAtTheLastDeleter) {
  const uint64_t hbm_before = Used(rt_, TM_TIER_HBM);
  DLManagedTensor* a = Export();
  DLManagedTensor* b = Export();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_GT(Used(rt_, TM_TIER_HBM), hbm_before);
  EXPECT_GT(Used(rt_, TM_TIER_DRAM), 0u);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t_));
  uint64_t bytes = 0;
  EXPECT_EQ(tm_tensor_bytes(rt_, t_, &bytes), TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(Used(rt_, TM_TIER_DRAM), 0u) << "the copy no export pins is freed at once";
  EXPECT_EQ(std::memcmp(a->dl_tensor.data, bytes_.data(), kBytes), 0) << "still readable";
  a->deleter(a);
  EXPECT_GT(Used(rt_, TM_TIER_HBM), hbm_before) << "one export is still out";
  EXPECT_EQ(std::memcmp(b->dl_tensor.data, bytes_.data(), kBytes), 0);
  b->deleter(b);
  EXPECT_EQ(Used(rt_, TM_TIER_HBM), hbm_before);
  EXPECT_EQ(Tensors(rt_), 0u);
}

// A plain acquire beside an export still makes a destroy TM_ERR_BUSY, changing nothing.
TEST_F(Dlpack, DestroyWithAPlainAcquireOutIsBusy) {
  DLManagedTensor* m = Export();
  ASSERT_NE(m, nullptr);
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t_, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_ERR_BUSY);
  TM_ASSERT_OK(tm_tensor_release(rt_, t_, TM_TIER_DRAM));
  m->deleter(m);
  EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_OK) << tm_last_error();
}

// Strides given are kept, and a DRAM export is host memory too.
TEST_F(Dlpack, StridesAndTheDramTier) {
  const int64_t strides[2] = {1, 64};  // a transposed view of the same bytes
  DLManagedTensor* m = Export(TM_TIER_DRAM, strides);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(m->dl_tensor.strides[0], 1);
  EXPECT_EQ(m->dl_tensor.strides[1], 64);
  m->deleter(m);
  EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_OK) << tm_last_error();
}

// Layouts that reach outside the tensor, or that DLPack cannot describe, are refused naming what
// is wrong, with *managed NULL and nothing acquired (a destroy succeeds after them).
TEST_F(Dlpack, BadLayoutsAreRefusedAndAcquireNothing) {
  const int64_t too_big[2] = {65, 128};
  const int64_t negative[2] = {-1, 128};
  const int64_t wide[2] = {256, 1};  // strides whose last element lies past the bytes
  struct Case {
    const char* what;
    int32_t ndim;
    const int64_t* shape;
    const int64_t* strides;
    uint8_t bits;
    uint64_t byte_offset;
    const char* says;
    uint8_t code = 2;
  } cases[] = {
      {"past the end", 2, too_big, nullptr, 32, 0, "reaches byte"},
      {"offset past the end", 2, shape_, nullptr, 32, 4, "reaches byte"},
      {"strides past the end", 2, shape_, wide, 32, 0, "reaches byte"},
      {"a negative size", 2, negative, nullptr, 32, 0, "negative"},
      {"bits not whole bytes", 2, shape_, nullptr, 12, 0, "multiple of 8"},
      {"too many dimensions", 65, shape_, nullptr, 32, 0, "ndim"},
      {"no shape", 2, nullptr, nullptr, 32, 0, "shape"},
      {"a type code DLPack has not", 2, shape_, nullptr, 32, 0, "DLDataTypeCode", 18},
  };
  for (const Case& c : cases) {
    tm_dlpack_layout layout = TM_DLPACK_LAYOUT_INIT;
    layout.ndim = c.ndim;
    layout.shape = c.shape;
    layout.strides = c.strides;
    layout.dtype_bits = c.bits;
    layout.byte_offset = c.byte_offset;
    layout.dtype_code = c.code;
    void* m = &layout;  // not NULL: the call must clear it
    EXPECT_EQ(tm_tensor_acquire_dlpack(rt_, t_, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &layout, &m),
              TM_ERR_INVALID_ARGUMENT)
        << c.what;
    EXPECT_EQ(m, nullptr) << c.what;
    EXPECT_NE(std::string(tm_last_error()).find(c.says), std::string::npos)
        << c.what << ": " << tm_last_error();
  }
  tm_dlpack_layout layout = TM_DLPACK_LAYOUT_INIT;
  void* m = nullptr;
  EXPECT_EQ(tm_tensor_acquire_dlpack(rt_, t_, TM_TIER_HBM, TM_ACCESS_READ, nullptr, nullptr, &m),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(
      tm_tensor_acquire_dlpack(rt_, t_, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &layout, nullptr),
      TM_ERR_INVALID_ARGUMENT);
  layout.struct_size = 8;
  EXPECT_EQ(tm_tensor_acquire_dlpack(rt_, t_, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &layout, &m),
            TM_ERR_INVALID_ARGUMENT);
  layout = TM_DLPACK_LAYOUT_INIT;
  EXPECT_EQ(tm_tensor_acquire_dlpack(rt_, t_, TM_TIER_NVME, TM_ACCESS_READ, nullptr, &layout, &m),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  layout.ndim = 0;  // a scalar: 4 bytes, fits
  TM_ASSERT_OK(
      tm_tensor_acquire_dlpack(rt_, t_, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &layout, &m));
  auto* scalar = static_cast<DLManagedTensor*>(m);
  EXPECT_EQ(scalar->dl_tensor.ndim, 0);
  scalar->deleter(scalar);
  EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_OK) << tm_last_error();
}

// A deleter that runs after the runtime is gone frees only its struct, and leaves the calling
// thread's last error as it was (it runs wherever the consumer frees the tensor).
// A host export (kDLCPU) acquired on a stream: its bytes have landed when the call returns (its
// consumer has no stream to wait on), here an 8 MiB copy the copy engine moves up from DRAM.
TEST_F(Dlpack, AHostExportOnAStreamHasLanded) {
  constexpr uint64_t kBig = 8ull << 20;
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = kBig;
  d.home_tier = TM_TIER_DRAM;
  for (int round = 0; round < 4; ++round) {
    tm_tensor big{0};
    TM_ASSERT_OK(tm_tensor_create(rt_, &d, &big));
    const std::vector<uint8_t> want = testing::RandomBytes(kBig, 11 + round);
    TM_ASSERT_OK(tm_tensor_write(rt_, big, 0, want.data(), kBig));
    TM_ASSERT_OK(tm_tensor_offload(rt_, big, TM_TIER_DRAM));
    TM_ASSERT_OK(tm_tensor_sync(rt_, big));
    tm_dlpack_layout layout = TM_DLPACK_LAYOUT_INIT;
    layout.dtype_bits = 8;
    layout.dtype_code = 1;  // kDLUInt
    layout.ndim = 1;
    const int64_t n = static_cast<int64_t>(kBig);
    layout.shape = &n;
    void* m = nullptr;
    TM_ASSERT_OK(tm_tensor_acquire_dlpack(rt_, big, TM_TIER_HBM, TM_ACCESS_READ,
                                          reinterpret_cast<void*>(0x1), &layout, &m));
    auto* managed = static_cast<DLManagedTensor*>(m);
    EXPECT_EQ(managed->dl_tensor.device.device_type, kDLCPU);
    EXPECT_EQ(std::memcmp(managed->dl_tensor.data, want.data(), kBig), 0) << "round " << round;
    managed->deleter(managed);
    TM_ASSERT_OK(tm_runtime_sync(rt_));
    TM_ASSERT_OK(tm_tensor_destroy(rt_, big));
  }
}

// An export kept past tm_runtime_destroy keeps the runtime's memory: it reads the bytes it was
// handed (not freed memory, nor a tensor of a runtime made since, which had reused it: an outside
// client read another tensor's bytes), and its deleter, quiet, frees the runtime.
TEST_F(Dlpack, AnExportOutlivesTheRuntimeAndItsDeleterIsQuiet) {
  DLManagedTensor* m = Export();
  ASSERT_NE(m, nullptr);
  TM_ASSERT_OK(tm_runtime_destroy(rt_));
  rt_ = tm_runtime{0};
  uint64_t bytes = 0;
  EXPECT_EQ(tm_tensor_bytes(tm_runtime{0}, t_, &bytes), TM_ERR_INVALID_HANDLE);
  tm_config c = testing::SmallConfig(dir_.path());
  c.device = TM_DEVICE_EMULATED;
  tm_runtime next{0};
  TM_ASSERT_OK(tm_runtime_create(&c, &next));
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = kBytes;
  d.home_tier = TM_TIER_DRAM;
  tm_tensor other{0};
  TM_ASSERT_OK(tm_tensor_create(next, &d, &other));
  const std::vector<uint8_t> zeros(kBytes, 0);
  TM_ASSERT_OK(tm_tensor_write(next, other, 0, zeros.data(), kBytes));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(next, other, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(std::memcmp(m->dl_tensor.data, bytes_.data(), kBytes), 0);
  TM_ASSERT_OK(tm_tensor_release(next, other, TM_TIER_HBM));
  const std::string before = tm_last_error();
  m->deleter(m);
  EXPECT_EQ(before, tm_last_error());
  TM_ASSERT_OK(tm_runtime_destroy(next));
}

// Deleters run on other threads than the acquire (PyTorch frees where the tensor dies), several
// at once, with destroys racing them.
TEST_F(Dlpack, DeletersOnOtherThreads) {
  std::vector<DLManagedTensor*> out;
  for (int i = 0; i < 16; ++i) out.push_back(Export());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int j = i; j < 16; j += 4) out[j]->deleter(out[j]);
    });
  }
  std::thread destroy([&] {
    // TM_OK (orphaned, or every export already gone): either way the tensor goes.
    EXPECT_EQ(tm_tensor_destroy(rt_, t_), TM_OK) << tm_last_error();
  });
  for (auto& t : threads) t.join();
  destroy.join();
  EXPECT_EQ(Tensors(rt_), 0u);
  EXPECT_EQ(Used(rt_, TM_TIER_DRAM), 0u);
}

}  // namespace
}  // namespace tiermem
