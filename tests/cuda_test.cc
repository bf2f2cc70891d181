// The CUDA backend on a real GPU: device slab, pinned host memory, copies both ways, and a
// runtime round trip. Compiled whenever the toolkit is; skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef TIERMEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "io/device.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!io::CudaBackendCompiled()) GTEST_SKIP() << "this build has no CUDA backend";
    auto d = io::CreateCudaDevice(0);
    if (!d.ok()) GTEST_SKIP() << "no usable GPU: " << d.status().message();
    device_ = std::move(*d);
  }
  std::unique_ptr<io::Device> device_;
};

TEST_F(Cuda, DescribesItself) {
  EXPECT_EQ(device_->kind(), "cuda");
  EXPECT_GT(device_->physical_bytes(), 0u);
  EXPECT_TRUE(device_->pci_bus_id().has_value());
}

TEST_F(Cuda, SlabCopiesBothWays) {
  const uint64_t n = (8 << 20) + 3;
  auto slab = device_->AllocateSlab(n);
  ASSERT_TRUE(slab.ok()) << slab.status();
  auto data = testing::RandomBytes(n, 1);
  std::vector<uint8_t> pinned(n), back(n);
  ASSERT_TRUE(device_->RegisterHost(pinned.data(), n).ok());
  std::memcpy(pinned.data(), data.data(), n);
  ASSERT_TRUE(
      device_->copy_engine().Copy(io::CopyDirection::kHostToDevice, *slab, pinned.data(), n).ok());
  ASSERT_TRUE(
      device_->copy_engine().Copy(io::CopyDirection::kDeviceToHost, back.data(), *slab, n).ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(device_->Fill(*slab, 0, n).ok());
  ASSERT_TRUE(
      device_->copy_engine().Copy(io::CopyDirection::kDeviceToHost, back.data(), *slab, n).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(n, 0));
  device_->UnregisterHost(pinned.data());
  device_->FreeSlab(*slab, n);
}

// What tiermem-probe's copy rows use: CUDA events around each copy; pinned faster than
// pageable is not asserted (it usually is, but that is a measurement, not behaviour).
TEST_F(Cuda, TimeCopiesWithEventsEveryKind) {
  const uint64_t n = 64 << 20;
  auto a = device_->AllocateSlab(n);
  auto b = device_->AllocateSlab(n);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> pinned(n, 1), pageable(n, 2);
  ASSERT_TRUE(device_->RegisterHost(pinned.data(), n).ok());
  using Kind = io::Device::CopyKind;
  struct Case {
    Kind kind;
    void* dst;
    const void* src;
  } cases[] = {{Kind::kHostToDevice, *a, pinned.data()},
               {Kind::kDeviceToHost, pinned.data(), *a},
               {Kind::kHostToDevice, *a, pageable.data()},
               {Kind::kDeviceToHost, pageable.data(), *a},
               {Kind::kDeviceToDevice, *b, *a}};
  for (const Case& c : cases) {
    auto t = device_->TimeCopies(c.kind, c.dst, c.src, n, 3);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->size(), 3u);
    for (double s : *t) {
      EXPECT_GT(s, 0);
      EXPECT_LT(s, 10.0) << "64 MiB took over 10 s";
    }
  }
  EXPECT_EQ(pageable, std::vector<uint8_t>(n, 1)) << "the device-to-host copies landed";
  device_->UnregisterHost(pinned.data());
  device_->FreeSlab(*a, n);
  device_->FreeSlab(*b, n);
}

TEST_F(Cuda, OversizedSlabIsOutOfMemory) {
  auto slab = device_->AllocateSlab(device_->physical_bytes() * 4);
  EXPECT_TRUE(absl::IsResourceExhausted(slab.status())) << slab.status();
  // The sticky error was cleared: the device still works.
  auto ok = device_->AllocateSlab(1 << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  device_->FreeSlab(*ok, 1 << 20);
}

TEST_F(Cuda, RuntimeRoundTrip) {
  testing::TempDir dir;
  tm_config cfg = testing::SmallConfig(dir.path());
  cfg.device = TM_DEVICE_CUDA;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = (32 << 20) + 1;
  tm_tensor t;
  ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK);
  auto data = testing::RandomBytes(d.bytes, 2);
  ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), d.bytes), TM_OK) << tm_last_error();
  ASSERT_EQ(testing::OffloadNow(rt, t, TM_TIER_NVME), TM_OK) << tm_last_error();
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
      << tm_last_error();
  ASSERT_EQ(tm_tensor_release(rt, t, TM_TIER_HBM), TM_OK);
  std::vector<uint8_t> back(d.bytes);
  ASSERT_EQ(tm_tensor_read(rt, t, 0, back.data(), d.bytes), TM_OK) << tm_last_error();
  EXPECT_EQ(back, data);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// Many copies in flight on the stream pool, large and small, each landing intact.
TEST_F(Cuda, ChunkedCopiesOnManyStreams) {
  const uint64_t big = 96ull << 20, small = 4096;
  auto slab = device_->AllocateSlab(big + 8 * small);
  ASSERT_TRUE(slab.ok()) << slab.status();
  auto data = testing::RandomBytes(big + 8 * small, 3);
  std::vector<uint8_t> host(data), back(data.size());
  ASSERT_TRUE(device_->RegisterHost(host.data(), host.size()).ok());
  char* d = static_cast<char*>(*slab);
  auto& e = device_->copy_engine();
  auto t_big = e.Enqueue(io::CopyDirection::kHostToDevice, d, host.data(), big);
  ASSERT_TRUE(t_big.ok());
  std::vector<io::CopyTicket> smalls;
  for (int i = 0; i < 8; ++i) {
    auto t = e.Enqueue(io::CopyDirection::kHostToDevice, d + big + i * small,
                       host.data() + big + i * small, small);
    ASSERT_TRUE(t.ok());
    smalls.push_back(*t);
  }
  for (auto t : smalls) EXPECT_TRUE(e.Wait(t).ok());
  EXPECT_TRUE(e.Wait(*t_big).ok());
  ASSERT_TRUE(e.Copy(io::CopyDirection::kDeviceToHost, back.data(), d, back.size()).ok());
  EXPECT_EQ(back, data);
  device_->UnregisterHost(host.data());
  device_->FreeSlab(*slab, big + 8 * small);
}

#ifdef TIERMEM_HAVE_CUDA
// An acquire with a stream returns before the copy lands; work queued on that stream after it
// sees the data, and a later host operation waits for it.
TEST_F(Cuda, StreamOrderedAcquire) {
  testing::TempDir dir;
  tm_config cfg = testing::SmallConfig(dir.path());
  cfg.device = TM_DEVICE_CUDA;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 48 << 20;
  tm_tensor t;
  ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK);
  auto data = testing::RandomBytes(d.bytes, 4);
  ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), d.bytes), TM_OK);
  ASSERT_EQ(testing::OffloadNow(rt, t, TM_TIER_DRAM), TM_OK) << tm_last_error();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, stream, &p), TM_OK)
      << tm_last_error();
  std::vector<uint8_t> back(d.bytes);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), p, d.bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(back, data);
  ASSERT_EQ(tm_tensor_release(rt, t, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_sync(rt, t), TM_OK) << tm_last_error();
  std::fill(back.begin(), back.end(), 0);
  ASSERT_EQ(tm_tensor_read(rt, t, 0, back.data(), d.bytes), TM_OK);
  EXPECT_EQ(back, data);
  cudaStreamDestroy(stream);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// The framework's allocator (tm_config.device_alloc/device_free) with cudaMalloc standing in for
// a caching allocator: HBM copies are its device pointers, each freed once, no slab taken.
struct CudaCounts {
  int allocs = 0, frees = 0, wrong_device = 0;
  size_t outstanding = 0, peak = 0;
};
void* CudaAlloc(void* user, size_t bytes, int32_t device, void*) {
  auto* c = static_cast<CudaCounts*>(user);
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) ++c->wrong_device;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  ++c->allocs;
  c->outstanding += bytes;
  c->peak = std::max(c->peak, c->outstanding);
  return p;
}
void CudaFree(void* user, void* p, size_t bytes, int32_t, void*) {
  auto* c = static_cast<CudaCounts*>(user);
  ++c->frees;
  c->outstanding -= bytes;
  cudaFree(p);
}

TEST_F(Cuda, FrameworkAllocatorCallbacks) {
  testing::TempDir dir;
  tm_config cfg = testing::SmallConfig(dir.path());
  cfg.device = TM_DEVICE_CUDA;
  cfg.hbm_bytes = 64 << 20;
  CudaCounts counts;
  cfg.device_alloc = &CudaAlloc;
  cfg.device_free = &CudaFree;
  cfg.device_allocator_user = &counts;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  tm_info info = TM_INFO_INIT;
  ASSERT_EQ(tm_runtime_info(rt, &info), TM_OK);
  EXPECT_EQ(info.device_allocator, 1);
  EXPECT_EQ(counts.allocs, 0) << "no slab";
  std::vector<tm_tensor> ts(2);
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 2; ++i) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = (40 << 20) + 3;  // two do not fit in 64 MiB: the second evicts the first
    ASSERT_EQ(tm_tensor_create(rt, &d, &ts[i]), TM_OK);
    data.push_back(testing::RandomBytes(d.bytes, 10 + i));
    ASSERT_EQ(tm_tensor_write(rt, ts[i], 0, data[i].data(), d.bytes), TM_OK) << tm_last_error();
  }
  EXPECT_EQ(counts.allocs, 2);
  EXPECT_EQ(counts.frees, 1);
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt, ts[0], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
      << tm_last_error();
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  std::vector<uint8_t> back(data[0].size());
  ASSERT_EQ(cudaMemcpy(back.data(), p, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, data[0]);
  ASSERT_EQ(tm_tensor_release(rt, ts[0], TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_read(rt, ts[1], 0, back.data(), back.size()), TM_OK) << tm_last_error();
  EXPECT_EQ(back, data[1]);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
  EXPECT_EQ(counts.allocs, counts.frees);
  EXPECT_EQ(counts.outstanding, 0u);
  EXPECT_LE(counts.peak, size_t{64} << 20);
  EXPECT_EQ(counts.wrong_device, 0);
}
#endif

}  // namespace
}  // namespace tiermem
