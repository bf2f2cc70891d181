// The reference for tiermem's HBM copy rows on a GPU: a plain loop of cudaMemcpyAsync between a
// pinned (cudaMallocHost) buffer and device memory, timed with CUDA events on a stream of its
// own, median of the repeats. Nothing of tiermem is used.
//
// The same copies are also timed on the host clock, from the call to the return of the
// blocking-sync wait for their end ("wall" rows): how tiermem-probe times the runtime's acquire
// and offload, so that tools/gpu_check_judge.sh sets like beside like (the event figure leaves
// out the launch and the host's wake-up, which every caller pays).
//
// usage: cuda_memcpy_ref [BYTES] [REPEATS] [DEVICE]   (defaults: 256 MiB, 10, 0)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    cudaError_t e = (call);                                                            \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "cuda_memcpy_ref: %s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Gbps {
  double events, wall;
};

// Medians over the same copies: by the device's events, and by the host clock from the call to
// the blocking-sync wait's return.
Gbps MedianGbps(void* dst, const void* src, size_t bytes, int repeats, cudaStream_t s) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreateWithFlags(&a, cudaEventBlockingSync));
  CHECK_CUDA(cudaEventCreateWithFlags(&b, cudaEventBlockingSync));
  std::vector<double> events, wall;
  for (int i = -2; i < repeats; ++i) {  // two warm-up copies
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    const double host_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i >= 0) {
      events.push_back(static_cast<double>(bytes) / 1e6 / ms);
      wall.push_back(static_cast<double>(bytes) / 1e9 / host_s);
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return {Median(events), Median(wall)};
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (256ull << 20);
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
  const int device = argc > 3 ? std::atoi(argv[3]) : 0;
  CHECK_CUDA(cudaSetDevice(device));
  void *host = nullptr, *dev = nullptr;
  CHECK_CUDA(cudaMallocHost(&host, bytes));
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMemsetAsync(dev, 1, bytes, s));
  std::fill(static_cast<char*>(host), static_cast<char*>(host) + bytes, 2);
  const Gbps h2d = MedianGbps(dev, host, bytes, repeats, s);
  const Gbps d2h = MedianGbps(host, dev, bytes, repeats, s);
  std::printf(
      "reference   dram -> hbm  pinned  %8.2f GB/s   (%zu MiB, cudaMemcpyAsync, events, median of "
      "%d)\n",
      h2d.events, bytes >> 20, repeats);
  std::printf(
      "reference   hbm  -> dram pinned  %8.2f GB/s   (%zu MiB, cudaMemcpyAsync, events, median of "
      "%d)\n",
      d2h.events, bytes >> 20, repeats);
  std::printf(
      "wall        dram -> hbm  pinned  %8.2f GB/s   (the same copies on the host clock, call to "
      "wait's return)\n",
      h2d.wall);
  std::printf(
      "wall        hbm  -> dram pinned  %8.2f GB/s   (the same copies on the host clock, call to "
      "wait's return)\n",
      d2h.wall);
  cudaStreamDestroy(s);
  cudaFree(dev);
  cudaFreeHost(host);
  return 0;
}
