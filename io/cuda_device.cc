// The CUDA backend: a real GPU through the CUDA runtime API, loaded at run time (io/cudart.h).
// Compiled whenever the toolkit is found; without one, or without a runtime or a device at run
// time, CreateCudaDevice says Unavailable and why.
//
// Errors: every call's return value is checked. cudaGetLastError is never called: it clears
// only non-sticky errors, and on a caller's thread it would wipe the caller's own error state.
// A sticky error (an illegal address, a launch failure...) means the context is lost: every
// later call of the process fails the same way, and the message says so.
//
// Devices: every CUDA call made on a caller's thread runs inside a DeviceGuard (save, set,
// restore), so that tiermem never changes the caller's current device; tiermem's own threads
// bind the device once (BindThread).
#include "io/device.h"

#ifdef TIERMEM_HAVE_CUDA

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/cuda_chunks.h"
#include "io/cudart.h"
#include "io/sync.h"

namespace tiermem::io {
namespace {

bool IsSticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

absl::Status CudaError(cudaError_t err, const char* what) {
  std::string msg = absl::StrFormat("%s: %s (%s)", what, Cudart().cudaGetErrorString(err),
                                    Cudart().cudaGetErrorName(err));
  if (IsSticky(err)) {
    absl::StrAppend(&msg,
                    "; this is a sticky error: the CUDA context is lost and every later CUDA call "
                    "of this process fails (restart the process)");
  }
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidResourceHandle:
    case cudaErrorContextIsDestroyed:
      return absl::InvalidArgumentError(msg);
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Calls the runtime's `fn` with the arguments after it; returns its error, named, if it fails.
#define TM_CUDA_RETURN_IF_ERROR(fn, ...)                                  \
  do {                                                                    \
    cudaError_t tm_cuda_err_ = Cudart().fn(__VA_ARGS__);                  \
    if (tm_cuda_err_ != cudaSuccess) return CudaError(tm_cuda_err_, #fn); \
  } while (0)

#define TM_CUDA_GUARD(device)    \
  DeviceGuard tm_guard_(device); \
  if (tm_guard_.status() != cudaSuccess) return CudaError(tm_guard_.status(), "cudaSetDevice")

// A CUDA event as a fence. Blocking-sync events: a host wait sleeps instead of spinning a core
// through a long copy.
class CudaFence final : public Fence {
 public:
  static absl::StatusOr<std::shared_ptr<CudaFence>> Record(int device, cudaStream_t stream) {
    TM_CUDA_GUARD(device);
    cudaEvent_t ev = nullptr;
    TM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags, &ev,
                            cudaEventBlockingSync | cudaEventDisableTiming);
    if (cudaError_t e = Cudart().cudaEventRecord(ev, stream); e != cudaSuccess) {
      Cudart().cudaEventDestroy(ev);
      return CudaError(e, "cudaEventRecord");
    }
    return std::make_shared<CudaFence>(device, ev);
  }
  CudaFence(int device, cudaEvent_t ev) : device_(device), event_(ev) {}
  ~CudaFence() override {
    DeviceGuard guard(device_);
    Cudart().cudaEventDestroy(event_);
  }
  absl::Status Wait() override {
    TM_CUDA_GUARD(device_);
    TM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize, event_);
    return absl::OkStatus();
  }
  bool Passed() override {
    DeviceGuard guard(device_);
    return Cudart().cudaEventQuery(event_) != cudaErrorNotReady;  // an error has "passed" too
  }
  cudaEvent_t event() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_;
};

// Checks a caller's stream before anything is enqueued behind it.
absl::Status CheckStream(int device, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = Cudart().cudaStreamIsCapturing(stream, &capture); e != cudaSuccess) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream %p is not a usable CUDA stream: %s (%s)", static_cast<void*>(stream),
        Cudart().cudaGetErrorString(e), Cudart().cudaGetErrorName(e)));
  }
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::UnimplementedError(absl::StrFormat(
        "stream %p is being captured into a CUDA graph: a stream-ordered copy would run once, at "
        "capture, not at each replay",
        static_cast<void*>(stream)));
  }
#if CUDART_VERSION >= 12080
  int stream_device = -1;
  if (Cudart().cudaStreamGetDevice(stream, &stream_device) == cudaSuccess &&
      stream_device != device) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stream %p belongs to CUDA device %d, not to tiermem's device %d",
                        static_cast<void*>(stream), stream_device, device));
  }
#endif
  return absl::OkStatus();
}

// Copies go round-robin over a few non-blocking streams per direction, each cut into chunks:
// the DMA engine interleaves streams at chunk granularity, so a small urgent copy is not stuck
// behind a huge one (cudf issue 15620).
class CudaCopyEngine final : public CopyEngine {
 public:
  static constexpr int kStreamsPerDirection = 4;
  static constexpr int kDirections = 4;
  static constexpr uint64_t kChunk = 8ull << 20;

  explicit CudaCopyEngine(int device) : device_(device) {}
  ~CudaCopyEngine() override {
    DeviceGuard guard(device_);
    for (auto& dir : streams_) {
      for (cudaStream_t s : dir) {
        if (s != nullptr) Cudart().cudaStreamDestroy(s);
      }
    }
  }

  absl::Status Init() {
    TM_CUDA_GUARD(device_);
    for (auto& dir : streams_) {
      for (cudaStream_t& s : dir) {
        TM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags, &s, cudaStreamNonBlocking);
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                                     const std::vector<FencePtr>& after) override {
    TM_CUDA_GUARD(device_);
    const int d = static_cast<int>(dir);
    cudaStream_t s = streams_[d][next_stream_[d]++ % kStreamsPerDirection];
    for (const FencePtr& f : after) {
      if (auto* cf = dynamic_cast<CudaFence*>(f.get()); cf != nullptr) {
        TM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent, s, cf->event(), 0);
      } else if (auto st = f->Wait(); !st.ok()) {
        return st;
      }
    }
    absl::Status status;
    for (uint64_t off = 0; off < bytes && status.ok(); off += kChunk) {
      // cudaMemcpyDefault: with unified addressing the runtime tells host from device memory.
      if (cudaError_t e = Cudart().cudaMemcpyAsync(
              static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
              std::min(kChunk, bytes - off), cudaMemcpyDefault, s);
          e != cudaSuccess) {
        status = CudaError(e, "cudaMemcpyAsync");
      }
    }
    absl::StatusOr<std::shared_ptr<CudaFence>> fence =
        status.ok() ? CudaFence::Record(device_, s)
                    : absl::StatusOr<std::shared_ptr<CudaFence>>(status);
    if (!fence.ok()) {
      // Chunks already enqueued keep reading src and writing dst: drain them before the caller
      // frees either.
      Cudart().cudaStreamSynchronize(s);
      return fence.status();
    }
    return CopyTicket{*std::move(fence)};
  }

  absl::StatusOr<FencePtr> RecordOnStream(void* stream) override {
    TM_CUDA_GUARD(device_);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (auto st = CheckStream(device_, s); !st.ok()) return st;
    auto f = CudaFence::Record(device_, s);
    if (!f.ok()) return f.status();
    return FencePtr(*std::move(f));
  }

  absl::Status StreamWait(void* stream, const FencePtr& fence) override {
    TM_CUDA_GUARD(device_);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (auto st = CheckStream(device_, s); !st.ok()) return st;
    auto* cf = dynamic_cast<CudaFence*>(fence.get());
    if (cf == nullptr) return fence->Wait();
    TM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent, s, cf->event(), 0);
    return absl::OkStatus();
  }

  cudaStream_t stream(CopyDirection d) const { return streams_[static_cast<int>(d)][0]; }

 private:
  int device_;
  cudaStream_t streams_[kDirections][kStreamsPerDirection] = {};
  std::atomic<uint32_t> next_stream_[kDirections] = {0, 0, 0, 0};
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
  uint64_t free_bytes() const override {
    DeviceGuard guard(device_);
    size_t free = 0, total = 0;
    if (guard.status() != cudaSuccess || Cudart().cudaMemGetInfo(&free, &total) != cudaSuccess)
      return 0;
    return free;
  }
  // Half the device, but never more than is free less a headroom for the framework beside
  // tiermem (its kernels' workspaces, cuBLAS handles, the caching allocator's next block).
  uint64_t default_budget() const override {
    const uint64_t total = props_.totalGlobalMem;
    const uint64_t headroom = std::max<uint64_t>(1ull << 30, total / 20);
    const uint64_t free = free_bytes();
    return std::min(total / 2, free > headroom ? free - headroom : 0);
  }
  std::optional<std::string> pci_bus_id() const override { return bus_id_; }

  absl::StatusOr<void*> AllocateSlab(uint64_t bytes) override {
    TM_CUDA_GUARD(device_);
    void* p = nullptr;
    TM_CUDA_RETURN_IF_ERROR(cudaMalloc, &p, bytes);
    return p;
  }
  void FreeSlab(void* slab, uint64_t) override {
    DeviceGuard guard(device_);
    Cudart().cudaFree(slab);
  }
  absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateChunkMapper(uint64_t bytes,
                                                                 uint64_t range_multiple) override {
    return CreateCudaChunkMapper(device_, bytes, range_multiple);
  }
  absl::Status RegisterHost(void* addr, uint64_t bytes) override {
    TM_CUDA_GUARD(device_);
    TM_CUDA_RETURN_IF_ERROR(cudaHostRegister, addr, bytes, cudaHostRegisterPortable);
    return absl::OkStatus();
  }
  void UnregisterHost(void* addr) override {
    DeviceGuard guard(device_);
    Cudart().cudaHostUnregister(addr);
  }
  absl::Status Fill(void* addr, int value, uint64_t bytes) override {
    TM_CUDA_GUARD(device_);
    cudaStream_t s = engine_.stream(CopyDirection::kHostToDevice);
    TM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync, addr, value, bytes, s);
    TM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize, s);
    return absl::OkStatus();
  }
  CopyEngine& copy_engine() override { return engine_; }

  bool IsDevicePointer(const void* p) override {
    DeviceGuard guard(device_);
    cudaPointerAttributes attr = {};
    if (Cudart().cudaPointerGetAttributes(&attr, p) != cudaSuccess) return false;
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  }
  void BindThread() override { Cudart().cudaSetDevice(device_); }

  absl::StatusOr<std::vector<double>> TimeCopies(CopyKind kind, void* dst, const void* src,
                                                 uint64_t bytes, int repeats) override {
    TM_CUDA_GUARD(device_);
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    // Own stream and events, destroyed on every path out.
    struct Resources {
      cudaStream_t stream = nullptr;
      cudaEvent_t start = nullptr, stop = nullptr;
      ~Resources() {
        if (start != nullptr) Cudart().cudaEventDestroy(start);
        if (stop != nullptr) Cudart().cudaEventDestroy(stop);
        if (stream != nullptr) Cudart().cudaStreamDestroy(stream);
      }
    } r;
    TM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags, &r.stream, cudaStreamNonBlocking);
    // Timing events (no cudaEventDisableTiming), but blocking-sync: the host sleeps meanwhile.
    TM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags, &r.start, cudaEventBlockingSync);
    TM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags, &r.stop, cudaEventBlockingSync);
    std::vector<double> seconds;
    for (int i = -1; i < repeats; ++i) {  // i == -1: the warm-up
      TM_CUDA_RETURN_IF_ERROR(cudaEventRecord, r.start, r.stream);
      TM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync, dst, src, bytes, k, r.stream);
      TM_CUDA_RETURN_IF_ERROR(cudaEventRecord, r.stop, r.stream);
      TM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize, r.stop);
      float ms = 0;
      TM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime, &ms, r.start, r.stop);
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
  if (auto rt = LoadCudaRuntime(); !rt.ok()) return rt.status();
  int count = 0;
  if (cudaError_t e = Cudart().cudaGetDeviceCount(&count); e != cudaSuccess) {
    return NoUsableDevice(e);
  }
  if (count == 0) return absl::UnavailableError("no CUDA device present");
  if (device_index < 0 || device_index >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TIERMEM_CUDA_DEVICE=%d: this machine has %d CUDA device(s)", device_index, count));
  }
  cudaDeviceProp props = {};
  if (cudaError_t e = Cudart().cudaGetDeviceProperties(&props, device_index); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceProperties");
  }
  char bus[32] = {};
  if (cudaError_t e = Cudart().cudaDeviceGetPCIBusId(bus, sizeof bus, device_index);
      e != cudaSuccess) {
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
