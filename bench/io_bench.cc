// tiermem_io_bench: one timed DRAM -> NVMe write and one NVMe -> DRAM read of a working set,
// through the runtime (offload / acquire): the real path, engine, block size and queue depth.
// Prints "write_bytes_per_second N" and "read_bytes_per_second N" for bench/fio_compare.sh.
//   tiermem_io_bench SIZE [REPEATS]      settings from TIERMEM_* (docs/environment.md)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tiermem_io_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tiermem_io_bench SIZE [REPEATS]\n");
    return 2;
  }
  auto size = ParseSize("SIZE", argv[1]);
  if (!size.ok() || size->percent > 0 || size->bytes == 0) return Fail(size.status());
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  const uint64_t bytes = size->bytes;
  // The tiers must hold the working set (plus the staging pool); everything else from TIERMEM_*.
  ConfigOverrides o;
  o.dram_bytes = SizeSetting{bytes + bytes / 2 + (64ull << 20), 0};
  o.nvme_bytes = SizeSetting{bytes + (64ull << 20), 0};
  o.device = DeviceKind::kEmulated;
  auto cfg = LoadConfig(o, ProcessEnvironment(), ProcessTiermemVariables());
  if (!cfg.ok()) return Fail(cfg.status());
  // The bench measures NVMe, not inclusive DRAM's hits: with a clean DRAM copy kept (the
  // default), the read back would be served from memory and never touch the device.
  cfg->dram_inclusive = false;
  auto rt = Runtime::Create(*cfg);
  if (!rt.ok()) return Fail(rt.status());
  Runtime& r = **rt;
  auto h = r.CreateTensor({bytes, TM_CLASS_OTHER, TM_TIER_DRAM, "bench"});
  if (!h.ok()) return Fail(h.status());
  auto p = r.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr);
  if (!p.ok()) return Fail(p.status());
  std::memset(*p, 0x5a, bytes);  // touch every page before timing
  (void)r.Release(*h, TM_TIER_DRAM);
  for (int i = 0; i < repeats; ++i) {
    // A write acquire makes the NVMe copy stale, so the offload really writes.
    auto d = r.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr);
    if (!d.ok()) return Fail(d.status());
    (void)r.Release(*h, TM_TIER_DRAM);
    auto t0 = Clock::now();
    if (auto s = r.Offload(*h, TM_TIER_NVME); !s.ok()) return Fail(s);
    if (auto s = r.Sync(*h); !s.ok()) return Fail(s);
    double w = std::chrono::duration<double>(Clock::now() - t0).count();
    t0 = Clock::now();
    auto q = r.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ, nullptr);
    if (!q.ok()) return Fail(q.status());
    double rd = std::chrono::duration<double>(Clock::now() - t0).count();
    (void)r.Release(*h, TM_TIER_DRAM);
    std::printf("write_bytes_per_second %.0f\nread_bytes_per_second %.0f\n",
                static_cast<double>(bytes) / w, static_cast<double>(bytes) / rd);
  }
  return 0;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
