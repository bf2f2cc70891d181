// The CUDA backend: a real GPU through the CUDA runtime API. Compiled whenever the toolkit is
// found; without one, CreateCudaDevice says Unavailable. Every call is checked, and a failed
// call's sticky error is cleared so that the next call does not inherit it.
#include "io/device.h"

#ifdef TIERMEM_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/sync.h"

namespace tiermem::io {
namespace {

absl::Status CudaError(cudaError_t err, const char* what) {
  cudaGetLastError();  // clear the sticky error
  std::string msg =
      absl::StrFormat("%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

#define TM_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                      \
    cudaError_t tm_cuda_err_ = (call);                                      \
    if (tm_cuda_err_ != cudaSuccess) return CudaError(tm_cuda_err_, #call); \
  } while (0)

// Copies go round-robin over a few non-blocking streams per direction, each cut into chunks:
// the DMA engine interleaves streams at chunk granularity, so a small urgent copy is not stuck
// behind a huge one (cudf issue 15620).
class CudaCopyEngine final : public CopyEngine {
 public:
  static constexpr int kStreamsPerDirection = 4;
  static constexpr uint64_t kChunk = 8ull << 20;

  explicit CudaCopyEngine(int device) : device_(device) {}
  ~CudaCopyEngine() override {
    cudaSetDevice(device_);
    for (auto& [id, ev] : events_) cudaEventDestroy(ev);
    for (auto& dir : streams_) {
      for (cudaStream_t s : dir) {
        if (s != nullptr) cudaStreamDestroy(s);
      }
    }
  }

  absl::Status Init() {
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (auto& dir : streams_) {
      for (cudaStream_t& s : dir) {
        TM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src,
                                     uint64_t bytes) override {
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const int d = static_cast<int>(dir);
    cudaStream_t s = streams_[d][next_stream_[d]++ % kStreamsPerDirection];
    cudaMemcpyKind kind =
        dir == CopyDirection::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (uint64_t off = 0; off < bytes; off += kChunk) {
      TM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + off,
                                              static_cast<const char*>(src) + off,
                                              std::min(kChunk, bytes - off), kind, s));
    }
    cudaEvent_t ev = nullptr;
    TM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    if (cudaError_t e = cudaEventRecord(ev, s); e != cudaSuccess) {
      cudaEventDestroy(ev);
      return CudaError(e, "cudaEventRecord");
    }
    MutexLock lock(&mu_);
    uint64_t id = ++next_id_;
    events_[id] = ev;
    return CopyTicket{id};
  }

  absl::Status Wait(CopyTicket ticket) override {
    cudaEvent_t ev = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = events_.find(ticket.id);
      if (it == events_.end()) return absl::InvalidArgumentError("unknown copy ticket");
      ev = it->second;
      events_.erase(it);
    }
    cudaError_t e = cudaEventSynchronize(ev);
    cudaEventDestroy(ev);
    if (e != cudaSuccess) return CudaError(e, "cudaEventSynchronize (copy)");
    return absl::OkStatus();
  }

  absl::Status StreamWait(void* stream, CopyTicket ticket) override {
    cudaEvent_t ev = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = events_.find(ticket.id);
      if (it == events_.end()) return absl::InvalidArgumentError("unknown copy ticket");
      ev = it->second;
    }
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    TM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev, 0));
    return absl::OkStatus();
  }

  cudaStream_t stream(CopyDirection d) const { return streams_[static_cast<int>(d)][0]; }

 private:
  int device_;
  cudaStream_t streams_[2][kStreamsPerDirection] = {};
  std::atomic<uint32_t> next_stream_[2] = {0, 0};
  Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, cudaEvent_t> events_ ABSL_GUARDED_BY(mu_);
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int device, cudaDeviceProp props, std::string bus_id)
      : device_(device), props_(props), bus_id_(std::move(bus_id)), engine_(device) {}

  absl::Status Init() { return engine_.Init(); }

  absl::string_view kind() const override { return "cuda"; }
  std::string Describe() const override {
    return absl::StrFormat("cuda:%d %s (%.1f GiB, PCI %s)", device_, props_.name,
                           static_cast<double>(props_.totalGlobalMem) / (1ull << 30), bus_id_);
  }
  uint64_t physical_bytes() const override { return props_.totalGlobalMem; }
  uint64_t default_budget() const override { return props_.totalGlobalMem / 2; }
  std::optional<std::string> pci_bus_id() const override { return bus_id_; }

  absl::StatusOr<void*> AllocateSlab(uint64_t bytes) override {
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    TM_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    return p;
  }
  void FreeSlab(void* slab, uint64_t) override {
    cudaSetDevice(device_);
    cudaFree(slab);
  }
  absl::Status RegisterHost(void* addr, uint64_t bytes) override {
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    TM_CUDA_RETURN_IF_ERROR(cudaHostRegister(addr, bytes, cudaHostRegisterPortable));
    return absl::OkStatus();
  }
  void UnregisterHost(void* addr) override {
    cudaSetDevice(device_);
    if (cudaHostUnregister(addr) != cudaSuccess) cudaGetLastError();
  }
  absl::Status Fill(void* addr, int value, uint64_t bytes) override {
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaStream_t s = engine_.stream(CopyDirection::kHostToDevice);
    TM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(addr, value, bytes, s));
    TM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  }
  CopyEngine& copy_engine() override { return engine_; }

  absl::StatusOr<std::vector<double>> TimeCopies(CopyKind kind, void* dst, const void* src,
                                                 uint64_t bytes, int repeats) override {
    TM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    // Own stream and events, destroyed on every path out.
    struct Resources {
      cudaStream_t stream = nullptr;
      cudaEvent_t start = nullptr, stop = nullptr;
      ~Resources() {
        if (start != nullptr) cudaEventDestroy(start);
        if (stop != nullptr) cudaEventDestroy(stop);
        if (stream != nullptr) cudaStreamDestroy(stream);
      }
    } r;
    TM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    TM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.start));
    TM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.stop));
    std::vector<double> seconds;
    for (int i = -1; i < repeats; ++i) {  // i == -1: the warm-up
      TM_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.start, r.stream));
      TM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, r.stream));
      TM_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.stop, r.stream));
      TM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.stop));
      float ms = 0;
      TM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.stop));
      if (i >= 0) seconds.push_back(static_cast<double>(ms) / 1e3);
    }
    return seconds;
  }

 private:
  int device_;
  cudaDeviceProp props_;
  std::string bus_id_;
  CudaCopyEngine engine_;
};

}  // namespace

bool CudaBackendCompiled() { return true; }

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int device_index) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrFormat("no usable CUDA device: %s (%s)",
                                                  cudaGetErrorString(e), cudaGetErrorName(e)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device present");
  if (device_index < 0 || device_index >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TIERMEM_CUDA_DEVICE=%d: this machine has %d CUDA device(s)", device_index, count));
  }
  cudaDeviceProp props = {};
  if (cudaError_t e = cudaGetDeviceProperties(&props, device_index); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceProperties");
  }
  char bus[32] = {};
  if (cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof bus, device_index); e != cudaSuccess) {
    return CudaError(e, "cudaDeviceGetPCIBusId");
  }
  auto dev = std::make_unique<CudaDevice>(device_index, props, std::string(bus));
  if (auto s = dev->Init(); !s.ok()) return s;
  return dev;
}

}  // namespace tiermem::io

#else  // !TIERMEM_HAVE_CUDA

namespace tiermem::io {

bool CudaBackendCompiled() { return false; }

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int) {
  return absl::UnavailableError(
      "this build of tiermem has no CUDA backend (the CUDA toolkit was not found at build time)");
}

}  // namespace tiermem::io

#endif
