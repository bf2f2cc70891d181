// The CUDA backend's internals shared by its files: a device guard, and HBM as chunks mapped
// through the driver's virtual memory management (cuMemCreate / cuMemMap). Only built with the
// CUDA toolkit.
#pragma once

#ifdef TIERMEM_HAVE_CUDA

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "io/cudart.h"
#include "io/device.h"

namespace tiermem::io {

// Makes `device` current for a scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (Cudart().cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = Cudart().cudaSetDevice(device);
      changed_ = status_ == cudaSuccess && previous_ >= 0;
    }
  }
  ~DeviceGuard() {
    if (changed_) Cudart().cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  cudaError_t status_ = cudaSuccess;
};

// `bytes` of device `device` as chunks of the driver's allocation granularity, with a reserved
// range `range_multiple` times as large. Unimplemented when the driver or device has no virtual
// memory management; ResourceExhausted when the device is short. The driver's functions are
// found through the runtime (cudaGetDriverEntryPointByVersion): nothing links libcuda.
absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateCudaChunkMapper(int device, uint64_t bytes,
                                                                   uint64_t range_multiple);

}  // namespace tiermem::io

#endif  // TIERMEM_HAVE_CUDA
