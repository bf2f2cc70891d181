// A device backend for the HBM tier: device memory, host pinning and a copy engine.
// Two implementations: CUDA (a real GPU) and emulated (host memory, for machines without one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/copy_engine.h"

namespace tiermem::io {

// Device memory as equal physical chunks and one reserved address range much larger than
// them: a chunk can be placed at any chunk-aligned offset of the range, so that the pages of one
// copy need not be neighbours in physical memory (the CUDA driver's virtual memory management;
// on the emulated device, huge pages moved with mremap). A chunk is at one place at a time.
// Not thread-safe: its owner locks.
class ChunkMapper {
 public:
  virtual ~ChunkMapper() = default;
  // Bytes per chunk: the device's mapping granularity.
  virtual uint64_t chunk_bytes() const = 0;
  // Physical chunks.
  virtual uint64_t chunks() const = 0;
  // The reserved range: range_bytes() from base(), a multiple of chunk_bytes().
  virtual char* base() const = 0;
  virtual uint64_t range_bytes() const = 0;
  // Maps `count` chunks, by index, side by side from base() + offset, readable and writable by
  // the device (and by the host on the emulated device). The chunks must not be mapped. Nothing
  // is left mapped on failure.
  virtual absl::Status Map(uint64_t offset, const uint64_t* chunks, uint64_t count) = 0;
  // Unmaps what one Map call mapped at base() + offset; the range stays reserved.
  virtual void Unmap(uint64_t offset, const uint64_t* chunks, uint64_t count) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "emulated" or "cuda".
  virtual absl::string_view kind() const = 0;
  // A line for humans: model, memory, link.
  virtual std::string Describe() const = 0;
  // Physical memory of the device: what percentages of TIERMEM_HBM_BYTES refer to.
  virtual uint64_t physical_bytes() const = 0;
  // Device memory free now (cudaMemGetInfo): what percentages of TIERMEM_HBM_BYTES refer to,
  // since a framework beside tiermem holds part of the device.
  virtual uint64_t free_bytes() const = 0;
  // Budget when TIERMEM_HBM_BYTES is not set.
  virtual uint64_t default_budget() const = 0;
  // PCI bus id of the device, for NUMA locality; nullopt for the emulated device.
  virtual std::optional<std::string> pci_bus_id() const = 0;

  // One large device allocation, sub-allocated by the HBM tier. ResourceExhausted when short.
  virtual absl::StatusOr<void*> AllocateSlab(uint64_t bytes) = 0;
  virtual void FreeSlab(void* slab, uint64_t bytes) = 0;
  // `bytes` of device memory as chunks (rounded down to whole chunks), with a range of
  // `range_multiple` times as many chunks to map them in. Unimplemented when the device cannot
  // map memory in pieces; InvalidArgument when `bytes` is below one chunk; ResourceExhausted when
  // short.
  virtual absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateChunkMapper(uint64_t bytes,
                                                                         uint64_t range_multiple) {
    (void)bytes;
    (void)range_multiple;
    return absl::UnimplementedError("this device cannot map memory in chunks");
  }
  // Pins host memory for DMA (cudaHostRegister); a no-op for the emulated device.
  virtual absl::Status RegisterHost(void* addr, uint64_t bytes) = 0;
  virtual void UnregisterHost(void* addr) = 0;
  // Sets device memory to a byte value; returns when done.
  virtual absl::Status Fill(void* device_addr, int value, uint64_t bytes) = 0;

  virtual CopyEngine& copy_engine() = 0;

  // Whether `p` is device memory (a caller's or a tier's): copies to or from it cross the link.
  // Host memory, pageable or pinned, is not.
  virtual bool IsDevicePointer(const void* p) = 0;
  // Makes the device current on the calling thread for good: for tiermem's own threads (callers'
  // threads get a scoped guard around each call instead).
  virtual void BindThread() {}

  // For bandwidth probes: copies `bytes` from src to dst `repeats` times, one after another, and
  // returns the seconds each copy took by the device's own clock: CUDA events recorded around
  // the copy on a stream of its own (as nvbandwidth does), or the wall clock around the
  // emulated device's copy engine (device-to-device: a memcpy, no link). Host memory may be
  // pinned or pageable; one untimed copy warms up first.
  enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
  virtual absl::StatusOr<std::vector<double>> TimeCopies(CopyKind kind, void* dst, const void* src,
                                                         uint64_t bytes, int repeats) = 0;
};

// A stream of the emulated device, for callers and tests: host functions run in order on a
// thread of its own, and its address is the stream handle passed to the C API (as a
// cudaStream_t is). Also the handles cudaStreamLegacy (0x1) and cudaStreamPerThread (0x2) name
// one process-wide emulated stream.
class EmulatedStream {
 public:
  EmulatedStream();
  ~EmulatedStream();  // runs what was launched, then goes
  EmulatedStream(const EmulatedStream&) = delete;
  EmulatedStream& operator=(const EmulatedStream&) = delete;

  // Runs `work` after everything launched before it.
  void Launch(std::function<void()> work);
  // Blocks until everything launched so far has run.
  void Synchronize();
  // While capturing (as cudaStreamBeginCapture), stream-ordered calls of tiermem refuse it.
  void SetCapturing(bool capturing);

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

struct EmulatedDeviceOptions {
  uint64_t physical_bytes = 0;  // 0: the machine's RAM
  double link_gbps = 0;         // per direction; 0: no cap
};
std::unique_ptr<Device> CreateEmulatedDevice(const EmulatedDeviceOptions& options);

// Whether this build contains the CUDA backend.
bool CudaBackendCompiled();
// Unavailable when the build has no CUDA backend, there is no driver or no device.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int device_index);

}  // namespace tiermem::io
