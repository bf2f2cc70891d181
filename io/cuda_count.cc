// How many CUDA devices this process sees; apart from the CUDA device backend so that choosing
// a device by local rank needs no device opened first.
#include "io/cuda_count.h"

#include "absl/strings/str_format.h"

#ifdef TIERMEM_HAVE_CUDA
#include "io/cudart.h"
#endif

namespace tiermem::io {

absl::StatusOr<int> CudaDeviceCount() {
#ifdef TIERMEM_HAVE_CUDA
  if (auto rt = LoadCudaRuntime(); !rt.ok()) return rt.status();
  int count = 0;
  if (cudaError_t e = Cudart().cudaGetDeviceCount(&count); e != cudaSuccess) {
    Cudart().cudaGetLastError();  // a failed call leaves its error behind for the next one to see
    return NoUsableDevice(e);
  }
  if (count <= 0) return absl::UnavailableError("no CUDA device present");
  return count;
#else
  return absl::UnavailableError("this build of tiermem has no CUDA backend");
#endif
}

}  // namespace tiermem::io
