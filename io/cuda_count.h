// How many CUDA devices this process sees, for choosing one by local rank.
#pragma once

#include "absl/status/statusor.h"

namespace tiermem::io {

// cudaGetDeviceCount (which honours CUDA_VISIBLE_DEVICES): Unavailable when the build has no
// CUDA backend, no CUDA runtime loads (io/cudart.h), or there is no usable driver or device.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace tiermem::io
