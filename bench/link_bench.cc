// The emulated link: 64 MiB copies through the emulated copy engine against the configured
// cap (counter "of_cap" = achieved / cap), beside an unthrottled memcpy of the same bytes (the
// ceiling no cap can exceed).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "io/device.h"

namespace tiermem {
namespace {

constexpr uint64_t kBytes = 64ull << 20;

void BM_Memcpy(benchmark::State& state) {
  std::vector<char> src(kBytes, 1), dst(kBytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);

// range(0): cap in GB/s; range(1): 0 host->device, 1 device->host.
void BM_EmulatedLink(benchmark::State& state) {
  const double cap = static_cast<double>(state.range(0));
  auto dev = io::CreateEmulatedDevice({0, cap});
  auto dir =
      state.range(1) == 0 ? io::CopyDirection::kHostToDevice : io::CopyDirection::kDeviceToHost;
  std::vector<char> src(kBytes, 1), dst(kBytes);
  std::memcpy(dst.data(), src.data(), kBytes);  // touch both
  for (auto _ : state) {
    if (!dev->copy_engine().Copy(dir, dst.data(), src.data(), kBytes).ok()) {
      state.SkipWithError("copy failed");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.counters["of_cap"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kBytes) / (cap * 1e9), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EmulatedLink)
    ->ArgsProduct({{2, 5, 10}, {0, 1}})
    ->ArgNames({"gbps", "d2h"})
    ->UseRealTime()
    ->MinTime(1.0)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tiermem

BENCHMARK_MAIN();
