// Hot-path micro benchmarks: allocator alloc/free at a steady fill, acquire/release of a
// tensor already resident (DESIGN: well under a microsecond), and the XXH3-64 of one checksum
// block (the CPU ceiling of TIERMEM_CHECKSUM=xxh3).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "lib/tiers/checksum.h"
#include "lib/tiers/offset_allocator.h"

namespace tiermem {
namespace {

// Alloc/free pairs with `state.range(0)` blocks already live: cost must not grow with it.
void BM_AllocatorAllocFree(benchmark::State& state) {
  OffsetAllocator a(1ull << 40, 4096);
  std::mt19937_64 rng(1);
  std::vector<uint32_t> live;
  for (int64_t i = 0; i < state.range(0); ++i)
    live.push_back(a.Allocate(4096 + rng() % (1 << 20))->block);
  size_t i = 0;
  for (auto _ : state) {
    auto x = a.Allocate(4096 + rng() % (1 << 20));
    benchmark::DoNotOptimize(x);
    size_t k = i++ % live.size();
    a.Free(live[k]);
    live[k] = x->block;
  }
}
BENCHMARK(BM_AllocatorAllocFree)->Arg(1000)->Arg(100000)->Arg(1000000);

void BM_AcquireResident(benchmark::State& state) {
  ConfigOverrides o;
  o.device = DeviceKind::kEmulated;
  o.hbm_bytes = SizeSetting{64ull << 20, 0};
  o.dram_bytes = SizeSetting{16ull << 20, 0};
  o.nvme_bytes = SizeSetting{16ull << 20, 0};
  auto cfg = LoadConfig(o, ProcessEnvironment(), {});
  auto rt = Runtime::Create(*cfg);
  if (!rt.ok()) {
    state.SkipWithError(std::string(rt.status().message()).c_str());
    return;
  }
  auto t = (*rt)->CreateTensor({1 << 20, TM_CLASS_PARAM, TM_TIER_HBM, "w"});
  (void)(*rt)->Acquire(*t, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr);
  (void)(*rt)->Release(*t, TM_TIER_HBM);
  for (auto _ : state) {
    auto p = (*rt)->Acquire(*t, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    benchmark::DoNotOptimize(p);
    (void)(*rt)->Release(*t, TM_TIER_HBM);
  }
}
BENCHMARK(BM_AcquireResident);

// Sums of a 1 MiB block (in cache) and of 256 MiB of blocks (from memory, as a large move hashes).
void BM_ChecksumBlocks(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  std::vector<char> data(bytes, 0x5a);
  BlockChecksums sums(1 << 20);
  for (auto _ : state) {
    auto s = sums.Hash(0, data.data(), bytes);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_ChecksumBlocks)->Arg(1 << 20)->Arg(256 << 20);

}  // namespace
}  // namespace tiermem

BENCHMARK_MAIN();
