// The CUDA backend on a real GPU: device slab, pinned host memory, copies both ways, and a
// runtime round trip. Compiled whenever the toolkit is; skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#ifdef TIERMEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "io/cudart.h"
#endif

#include "io/device.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

// Registers host memory for the scope: an early ASSERT return never leaves it registered
// (a later test would fail with cudaErrorHostMemoryAlreadyRegistered).
class Registration {
 public:
  Registration(io::Device& d, void* p, uint64_t n) : d_(d), p_(p), ok_(d.RegisterHost(p, n).ok()) {}
  ~Registration() {
    if (ok_) d_.UnregisterHost(p_);
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  bool ok() const { return ok_; }

 private:
  io::Device& d_;
  void* p_;
  bool ok_;
};

// A device slab for the scope.
class Slab {
 public:
  Slab(io::Device& d, uint64_t n) : d_(d), n_(n) {
    auto s = d.AllocateSlab(n);
    if (s.ok()) p_ = static_cast<char*>(*s);
  }
  ~Slab() {
    if (p_ != nullptr) d_.FreeSlab(p_, n_);
  }
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
  char* get() const { return p_; }

 private:
  io::Device& d_;
  uint64_t n_;
  char* p_ = nullptr;
};

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

#ifdef TIERMEM_HAVE_CUDA
// The backend's runtime is loaded once and, when the process already has libcudart (this test
// links it; a PyTorch process has torch's), it is that one, not a second copy from elsewhere.
// Needs no GPU: runs wherever the backend is compiled.
TEST(CudaRuntimeLoad, BindsTheProcessOwnRuntimeOnce) {
  auto first = io::LoadCudaRuntime();
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = io::LoadCudaRuntime();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(&io::Cudart(), *first);
  EXPECT_NE((*first)->path.find("already loaded"), std::string::npos) << (*first)->path;
  EXPECT_EQ((*first)->cudaGetDeviceCount, &::cudaGetDeviceCount);
  EXPECT_EQ((*first)->cudaMemcpyAsync, &::cudaMemcpyAsync);
}
#endif

TEST_F(Cuda, DescribesItself) {
  EXPECT_EQ(device_->kind(), "cuda");
  EXPECT_GT(device_->physical_bytes(), 0u);
  EXPECT_TRUE(device_->pci_bus_id().has_value());
}

TEST_F(Cuda, SlabCopiesBothWays) {
  const uint64_t n = (8 << 20) + 3;
  Slab slab(*device_, n);
  ASSERT_NE(slab.get(), nullptr);
  auto data = testing::RandomBytes(n, 1);
  std::vector<uint8_t> pinned(n), back(n);
  Registration reg(*device_, pinned.data(), n);
  ASSERT_TRUE(reg.ok());
  std::memcpy(pinned.data(), data.data(), n);
  auto& e = device_->copy_engine();
  ASSERT_TRUE(e.Copy(io::CopyDirection::kHostToDevice, slab.get(), pinned.data(), n).ok());
  ASSERT_TRUE(e.Copy(io::CopyDirection::kDeviceToHost, back.data(), slab.get(), n).ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(device_->IsDevicePointer(slab.get()));
  EXPECT_FALSE(device_->IsDevicePointer(pinned.data()));
  EXPECT_FALSE(device_->IsDevicePointer(back.data()));
  ASSERT_TRUE(device_->Fill(slab.get(), 0, n).ok());
  ASSERT_TRUE(e.Copy(io::CopyDirection::kDeviceToHost, back.data(), slab.get(), n).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(n, 0));
}

// What tiermem-probe's copy rows use: CUDA events around each copy; pinned faster than
// pageable is not asserted (it usually is, but that is a measurement, not behaviour).
TEST_F(Cuda, TimeCopiesWithEventsEveryKind) {
  const uint64_t n = 64 << 20;
  Slab a(*device_, n), b(*device_, n);
  ASSERT_TRUE(a.get() != nullptr && b.get() != nullptr);
  std::vector<uint8_t> pinned(n, 1), pageable(n, 2);
  Registration reg(*device_, pinned.data(), n);
  ASSERT_TRUE(reg.ok());
  using Kind = io::Device::CopyKind;
  struct Case {
    Kind kind;
    void* dst;
    const void* src;
  } cases[] = {{Kind::kHostToDevice, a.get(), pinned.data()},
               {Kind::kDeviceToHost, pinned.data(), a.get()},
               {Kind::kHostToDevice, a.get(), pageable.data()},
               {Kind::kDeviceToHost, pageable.data(), a.get()},
               {Kind::kDeviceToDevice, b.get(), a.get()}};
  for (const Case& c : cases) {
    auto t = device_->TimeCopies(c.kind, c.dst, c.src, n, 3);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->size(), 3u);
    for (double s : *t) {
      EXPECT_GT(s, 0);
      EXPECT_LT(s, 10.0) << "64 MiB took over 10 s";
    }
  }
  // The pinned round trip carried 1s; the pageable one then carried the pageable 2s to the
  // device and back.
  EXPECT_EQ(pinned, std::vector<uint8_t>(n, 1));
  EXPECT_EQ(pageable, std::vector<uint8_t>(n, 2));
}

TEST_F(Cuda, OversizedSlabIsOutOfMemory) {
  auto slab = device_->AllocateSlab(device_->physical_bytes() * 4);
  EXPECT_TRUE(absl::IsResourceExhausted(slab.status())) << slab.status();
  // Out of memory is not a sticky error: the device still works.
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
  Slab slab(*device_, big + 8 * small);
  ASSERT_NE(slab.get(), nullptr);
  auto data = testing::RandomBytes(big + 8 * small, 3);
  std::vector<uint8_t> host(data), back(data.size());
  Registration reg(*device_, host.data(), host.size());
  ASSERT_TRUE(reg.ok());
  char* d = slab.get();
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
  for (const auto& t : smalls) EXPECT_TRUE(e.Wait(t).ok());
  EXPECT_TRUE(e.Wait(*t_big).ok());
  ASSERT_TRUE(e.Copy(io::CopyDirection::kDeviceToHost, back.data(), d, back.size()).ok());
  EXPECT_EQ(back, data);
}

#ifdef TIERMEM_HAVE_CUDA
// Holds a stream at a host function until opened: work queued behind it cannot run, so a call
// that returns while the gate is shut did not wait (on the host) for that work. A watchdog opens
// it after a few seconds, so that a wrong host wait fails the test instead of hanging it.
class Gate {
 public:
  explicit Gate(cudaStream_t s) {
    launched_ = cudaLaunchHostFunc(s, &Gate::Hold, this) == cudaSuccess;
    watchdog_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::seconds(3), [this] { return open_; })) {
        open_ = by_watchdog_ = true;
        cv_.notify_all();
      }
    });
  }
  ~Gate() {
    Open();
    watchdog_.join();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !launched_ || passed_; });  // the stream is past Hold
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool launched() const { return launched_; }
  bool passed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return passed_;
  }
  bool opened_by_watchdog() const {
    std::lock_guard<std::mutex> lock(mu_);
    return by_watchdog_;
  }

 private:
  static void CUDART_CB Hold(void* self) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock<std::mutex> lock(g->mu_);
    g->cv_.wait(lock, [g] { return g->open_; });
    g->passed_ = true;
    g->cv_.notify_all();
  }
  bool launched_ = false;
  mutable std::mutex mu_;  // guards open_, passed_ and by_watchdog_
  std::condition_variable cv_;
  bool open_ = false, passed_ = false, by_watchdog_ = false;
  std::thread watchdog_;
};

// Pinned host memory: a device-to-host cudaMemcpyAsync into pageable memory blocks the host
// until the copy is done, which behind a shut gate would be a wait this test did not mean.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(uint64_t n) : n_(n) {
    if (cudaMallocHost(&p_, n) != cudaSuccess) p_ = nullptr;
  }
  ~PinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  std::vector<uint8_t> bytes() const { return std::vector<uint8_t>(data(), data() + n_); }

 private:
  uint64_t n_;
  void* p_ = nullptr;
};

// A runtime on the GPU with a stream of the caller's.
class CudaRuntime : public Cuda {
 protected:
  void SetUp() override {
    Cuda::SetUp();
    if (IsSkipped()) return;
    tm_config cfg = testing::SmallConfig(dir_.path());
    cfg.device = TM_DEVICE_CUDA;
    cfg.prefetch_depth = 0;
    ASSERT_EQ(tm_runtime_create(&cfg, &rt_), TM_OK) << tm_last_error();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error();
    }
  }
  tm_tensor Make(uint64_t bytes, tm_tier home) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.home_tier = home;
    tm_tensor t{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  testing::TempDir dir_;
  tm_runtime rt_{0};
  cudaStream_t stream_ = nullptr;
};

// An acquire with a stream returns while the copy is still in flight (ordered behind the shut
// gate on the caller's stream); work queued on that stream after it sees the data.
TEST_F(CudaRuntime, StreamOrderedAcquireLeavesTheCopyInFlight) {
  const uint64_t n = 48 << 20;
  tm_tensor t = Make(n, TM_TIER_HBM);
  auto data = testing::RandomBytes(n, 4);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, data.data(), n), TM_OK) << tm_last_error();
  ASSERT_EQ(testing::OffloadNow(rt_, t, TM_TIER_DRAM), TM_OK) << tm_last_error();
  PinnedBuffer pinned(n);
  ASSERT_NE(pinned.data(), nullptr);
  {
    Gate gate(stream_);
    ASSERT_TRUE(gate.launched());
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, stream_, &p), TM_OK)
        << tm_last_error();
    EXPECT_FALSE(gate.passed()) << "acquire waited for the caller's stream";
    ASSERT_EQ(cudaMemcpyAsync(pinned.data(), p, n, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    ASSERT_EQ(tm_tensor_release_on_stream(rt_, t, TM_TIER_HBM, stream_), TM_OK) << tm_last_error();
    gate.Open();
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_FALSE(gate.opened_by_watchdog());
  }
  std::vector<uint8_t> back = pinned.bytes();
  EXPECT_EQ(back, data);
  ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
  std::fill(back.begin(), back.end(), 0);
  ASSERT_EQ(tm_tensor_read(rt_, t, 0, back.data(), n), TM_OK);
  EXPECT_EQ(back, data);
}

// The caller's device memory into a DRAM-homed tensor and back out on the caller's stream:
// both calls return while the stream is held, nothing passes through tiermem's HBM.
TEST_F(CudaRuntime, CopyInAndOutOfDeviceMemoryOnAStream) {
  const uint64_t n = (32 << 20) + 7;
  tm_tensor t = Make(n, TM_TIER_DRAM);
  auto data = testing::RandomBytes(n, 5);
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  PinnedBuffer pinned(n);
  ASSERT_NE(pinned.data(), nullptr);
  {
    Gate gate(stream_);
    ASSERT_TRUE(gate.launched());
    ASSERT_EQ(tm_tensor_copy_in(rt_, t, 0, src, n, stream_), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_copy_out(rt_, t, 0, dst, n, stream_), TM_OK) << tm_last_error();
    EXPECT_FALSE(gate.passed()) << "a copy waited for the caller's stream on the host";
    ASSERT_EQ(cudaMemcpyAsync(pinned.data(), dst, n, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    gate.Open();
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_FALSE(gate.opened_by_watchdog());
  }
  std::vector<uint8_t> back = pinned.bytes();
  EXPECT_EQ(back, data);
  ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
  tm_stats s = TM_STATS_INIT;
  ASSERT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
  EXPECT_EQ(s.tiers[TM_TIER_HBM].peak, 0u) << "the copies went through tiermem's HBM";
  // Out of NVMe into device memory, pipelined through staging.
  ASSERT_EQ(testing::OffloadNow(rt_, t, TM_TIER_NVME), TM_OK) << tm_last_error();
  ASSERT_EQ(cudaMemset(dst, 0, n), cudaSuccess);
  ASSERT_EQ(tm_tensor_copy_out(rt_, t, 0, dst, n, stream_), TM_OK) << tm_last_error();
  ASSERT_EQ(cudaMemcpyAsync(back.data(), dst, n, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(back, data);
  cudaFree(src);
  cudaFree(dst);
}

// Work queued on the stream writes the HBM copy after its release; the offload queued at once
// moves what that work wrote.
TEST_F(CudaRuntime, ReleaseOnStreamOrdersTheOffload) {
  const uint64_t n = 16 << 20;
  tm_tensor t = Make(n, TM_TIER_HBM);
  std::vector<uint8_t> back(n, 0x11);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, back.data(), n), TM_OK) << tm_last_error();
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr, &p), TM_OK);
  {
    Gate gate(stream_);
    ASSERT_TRUE(gate.launched());
    ASSERT_EQ(cudaMemsetAsync(p, 0x5a, n, stream_), cudaSuccess);
    ASSERT_EQ(tm_tensor_release_on_stream(rt_, t, TM_TIER_HBM, stream_), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_offload(rt_, t, TM_TIER_DRAM), TM_OK) << tm_last_error();
    EXPECT_FALSE(gate.passed());
    gate.Open();
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    EXPECT_FALSE(gate.opened_by_watchdog());
  }
  ASSERT_EQ(tm_tensor_read(rt_, t, 0, back.data(), n), TM_OK);
  EXPECT_EQ(back, std::vector<uint8_t>(n, 0x5a));
}

// A stream being captured into a graph is refused: the copy would run once, at capture.
TEST_F(CudaRuntime, StreamUnderCaptureIsRefused) {
  tm_tensor t = Make(1 << 20, TM_TIER_DRAM);
  std::vector<uint8_t> host(1 << 20, 3);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, host.data(), host.size()), TM_OK);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(tm_tensor_copy_out(rt_, t, 0, host.data(), host.size(), stream_), TM_ERR_UNSUPPORTED);
  void* p = nullptr;
  EXPECT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, stream_, &p),
            TM_ERR_UNSUPPORTED);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
}

// tiermem's calls leave the caller's current device as it was.
TEST_F(CudaRuntime, CallersDeviceIsRestored) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two GPUs (tiermem uses device 0; the caller sets 1)";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  tm_tensor t = Make(1 << 20, TM_TIER_HBM);
  std::vector<uint8_t> host(1 << 20, 7);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, host.data(), host.size()), TM_OK);
  ASSERT_EQ(tm_tensor_read(rt_, t, 0, host.data(), host.size()), TM_OK);
  ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK);
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, 1);
  cudaSetDevice(0);
}

// Without TIERMEM_HBM_BYTES the budget leaves the framework what is free beyond it.
TEST_F(Cuda, DefaultBudgetFitsInFreeMemory) {
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  testing::TempDir dir;
  tm_config cfg = testing::SmallConfig(dir.path());
  cfg.device = TM_DEVICE_CUDA;
  cfg.hbm_bytes = 0;
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  tm_info info = TM_INFO_INIT;
  ASSERT_EQ(tm_runtime_info(rt, &info), TM_OK);
  EXPECT_LE(info.tier_bytes[TM_TIER_HBM], total / 2);
  EXPECT_LE(info.tier_bytes[TM_TIER_HBM], free);
  EXPECT_EQ(info.hbm_device_pointers, 1);
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
