// The CUDA runtime as a table of functions loaded at run time (dlopen), not linked: a library
// built with the CUDA backend then loads on machines without CUDA, and uses the libcudart.so.N
// the process has or can find (torch's CUDA wheels, a toolkit's). Only built with the toolkit.
#pragma once

#ifdef TIERMEM_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"

// X(function) for every runtime function the CUDA backend calls. A function added here is looked
// up at load; a runtime without it is refused, naming it.
// clang-format off
#define TM_CUDART_CORE_FUNCTIONS(X)                                                      \
  X(cudaGetDeviceCount) X(cudaGetDevice) X(cudaSetDevice) X(cudaGetDeviceProperties)     \
  X(cudaDeviceGetPCIBusId) X(cudaGetErrorString) X(cudaGetErrorName) X(cudaGetLastError) \
  X(cudaMalloc) X(cudaFree) X(cudaMemGetInfo) X(cudaHostRegister) X(cudaHostUnregister)  \
  X(cudaPointerGetAttributes) X(cudaMemsetAsync) X(cudaMemcpyAsync)                      \
  X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamSynchronize)             \
  X(cudaStreamWaitEvent) X(cudaStreamIsCapturing) X(cudaEventCreateWithFlags)            \
  X(cudaEventDestroy) X(cudaEventRecord) X(cudaEventSynchronize) X(cudaEventQuery)       \
  X(cudaEventElapsedTime) X(cudaGetDriverEntryPointByVersion)
// clang-format on
#if CUDART_VERSION >= 12080
#define TM_CUDART_FUNCTIONS(X) TM_CUDART_CORE_FUNCTIONS(X) X(cudaStreamGetDevice)
#else
#define TM_CUDART_FUNCTIONS(X) TM_CUDART_CORE_FUNCTIONS(X)
#endif

namespace tiermem::io {

// The runtime's functions, each named as the function it points to.
struct CudaRuntime {
#define TM_CUDART_MEMBER(fn) decltype(&::fn) fn = nullptr;
  TM_CUDART_FUNCTIONS(TM_CUDART_MEMBER)
#undef TM_CUDART_MEMBER
  std::string path;  // the file it was loaded from, or the soname when found already loaded
};

// The process's CUDA runtime, libcudart.so.<the toolkit's major version>, loaded on the first
// call (thread-safe) and kept for the life of the process; every later call returns the same.
// Looked for in this order: already loaded in the process (torch's, say); the nvidia wheels'
// folders beside the Python package this object belongs to (site-packages/nvidia/cu13/lib,
// nvidia/cuda_runtime/lib); $CUDA_HOME/lib64; /usr/local/cuda/lib64; the toolkit folder found
// at build time; the loader's default search path (LD_LIBRARY_PATH, ld.so.cache).
// Unavailable, naming every place tried, when none loads or one lacks a function.
absl::StatusOr<const CudaRuntime*> LoadCudaRuntime();

// "no usable CUDA device: ..." for cudaGetDeviceCount's error e, saying so plainly where the
// driver itself is missing (the runtime reports no libcuda.so.1 as an insufficient driver, which
// reads as "upgrade the driver").
absl::Status NoUsableDevice(cudaError_t e);

// The runtime after LoadCudaRuntime succeeded: the CUDA backend's objects exist only then (it
// aborts if called before, a programming error).
const CudaRuntime& Cudart();

}  // namespace tiermem::io

#endif  // TIERMEM_HAVE_CUDA
