// step_bench: an emulated training step under ZeRO-Infinity placement. Forward acquires each
// layer's parameters (home NVMe) in HBM, "computes" for a set time, writes an activation and
// offloads it to DRAM; backward walks the layers in reverse, re-acquiring activations and
// parameters, computing twice as long. The emulated link is capped. For each prefetch depth it
// prints the step's wall time (its one-byte output check included) against two bounds of the
// form max(total compute, each link's bytes at its bandwidth), and against depth 0:
//   minimum: the least bytes any correct schedule must move at this HBM size: the activations
//     (offloaded by the workload) down and up once, and the parameters that cannot be in HBM,
//     once at the step's start and once at the turn to backward: 2 max(0, L P - HBM);
//   own: the bytes this run moved (tm_stats.bytes_moved, steps after the first); a run that
//     moves redundant bytes raises this bound, never the minimum.
//   step_bench [--layers N] [--param-mib M] [--act-mib M] [--compute-ms T] [--link-gbps G]
//              [--hbm-mib M] [--steps S] [--depths 0,1,2,4,8]
// A depth of "config" takes TIERMEM_PREFETCH_DEPTH (or TIERMEM_ENV_FILE's value).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "tools/shared/step_workload.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int layers = 12;
  // Parameters and activations of one size, and compute equal to their transfer time: each
  // layer moves as long as it computes, in both directions of the pass.
  uint64_t param = 16ull << 20, act = 16ull << 20;
  double compute_ms = 3.4;  // forward, per layer; backward is twice that
  double link_gbps = 5;
  uint64_t hbm = 128ull << 20;
  int steps = 6;
  std::vector<int> depths = {0, 1, 2, 4, 8};  // -1: TIERMEM_PREFETCH_DEPTH (or its env file)
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

absl::StatusOr<std::unique_ptr<Runtime>> Make(const Options& o, int depth) {
  ConfigOverrides c;
  c.device = DeviceKind::kEmulated;
  c.emu_link_gbps = o.link_gbps;
  c.hbm_bytes = SizeSetting{o.hbm, 0};
  c.dram_bytes = SizeSetting{o.layers * (o.act + o.param) + (512ull << 20), 0};
  c.nvme_bytes = SizeSetting{o.layers * o.param + (512ull << 20), 0};
  if (depth >= 0) c.prefetch_depth = static_cast<uint32_t>(depth);
  c.placement = Placement::kZeroInfinity;
  auto cfg = LoadConfig(c, ProcessEnvironment(), ProcessTiermemVariables());
  if (!cfg.ok()) return cfg.status();
  return Runtime::Create(*cfg);
}

#define BENCH_RETURN_IF_ERROR(expr) \
  do {                              \
    absl::Status s_ = (expr);       \
    if (!s_.ok()) return s_;        \
  } while (0)

// NVMe -> DRAM bandwidth of the runtime's own path, median of 5.
absl::StatusOr<double> NvmeReadGbps(Runtime& rt, uint64_t bytes) {
  auto h = rt.CreateTensor({bytes, TM_CLASS_OTHER, TM_TIER_NVME, "probe"});
  if (!h.ok()) return h.status();
  std::vector<char> data(bytes, 1);
  BENCH_RETURN_IF_ERROR(rt.Write(*h, 0, data.data(), bytes));
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    auto p = rt.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ, nullptr);
    if (!p.ok()) return p.status();
    t.push_back(Seconds(Clock::now() - t0));
    BENCH_RETURN_IF_ERROR(rt.Release(*h, TM_TIER_DRAM));
    BENCH_RETURN_IF_ERROR(rt.Offload(*h, TM_TIER_NVME));
    BENCH_RETURN_IF_ERROR(rt.Sync(*h));
  }
  std::sort(t.begin(), t.end());
  BENCH_RETURN_IF_ERROR(rt.DestroyTensor(*h));
  return static_cast<double>(bytes) / t[2] / 1e9;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    double d = 0;
    if (!absl::SimpleAtod(v, &d) && k != "--depths") {
      std::fprintf(stderr, "step_bench: bad value %s for %s\n", v.c_str(), k.c_str());
      return 2;
    }
    if (k == "--layers")
      o.layers = static_cast<int>(d);
    else if (k == "--param-mib")
      o.param = static_cast<uint64_t>(d * (1 << 20));
    else if (k == "--act-mib")
      o.act = static_cast<uint64_t>(d * (1 << 20));
    else if (k == "--compute-ms")
      o.compute_ms = d;
    else if (k == "--link-gbps")
      o.link_gbps = d;
    else if (k == "--hbm-mib")
      o.hbm = static_cast<uint64_t>(d * (1 << 20));
    else if (k == "--steps")
      o.steps = std::max(2, static_cast<int>(d));
    else if (k == "--depths") {
      o.depths.clear();
      for (absl::string_view p : absl::StrSplit(v, ',')) {
        o.depths.push_back(p == "config" ? -1 : std::atoi(std::string(p).c_str()));
      }
    } else {
      std::fprintf(stderr, "step_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  // Measured NVMe read bandwidth for the bound (the link's is its cap).
  auto probe = Make(o, 0);
  if (!probe.ok())
    return std::fprintf(stderr, "%s\n", std::string(probe.status().message()).c_str()), 1;
  auto nvme = NvmeReadGbps(**probe, 256ull << 20);
  probe->reset();
  if (!nvme.ok())
    return std::fprintf(stderr, "%s\n", std::string(nvme.status().message()).c_str()), 1;

  const double L = o.layers, P = static_cast<double>(o.param), A = static_cast<double>(o.act);
  const double compute = L * o.compute_ms * 3 / 1e3;
  const double link = o.link_gbps * 1e9;
  // The minimum bytes per step (see the header); no NVMe read is compulsory: DRAM holds every
  // parameter after the first step.
  const double carried = std::max(0.0, L * P - static_cast<double>(o.hbm));
  const double h2d = (2 * carried + L * A) / link;
  const double d2h = L * A / link;
  const double minimum = std::max({compute, h2d, d2h});
  std::printf(
      "step_bench: %d layers, params %.0f MiB (NVMe home), activations %.0f MiB, HBM %.0f MiB\n",
      o.layers, P / (1 << 20), A / (1 << 20), static_cast<double>(o.hbm) / (1 << 20));
  std::printf(
      "  compute %.1f ms/step; link %.1f GB/s: minimum h2d %.1f ms, d2h %.1f ms; NVMe read %.2f "
      "GB/s (measured)\n\n",
      compute * 1e3, o.link_gbps, h2d * 1e3, d2h * 1e3, *nvme);
  std::printf("%6s %10s %10s %8s %10s %8s %12s %8s %8s %10s\n", "depth", "step ms", "min ms",
              "/ min", "own ms", "/ own", "vs depth 0", "hits", "misses", "evictions");
  double base = 0;
  for (int depth : o.depths) {
    auto rt = Make(o, depth);
    if (!rt.ok()) {
      std::fprintf(stderr, "step_bench: %s\n", std::string(rt.status().message()).c_str());
      return 1;
    }
    auto r = RunSteps(**rt, {o.layers, o.param, o.act, o.compute_ms, o.steps});
    if (!r.ok()) {
      std::fprintf(stderr, "step_bench: depth %d: %s\n", depth,
                   std::string(r.status().message()).c_str());
      return 1;
    }
    const double nvme_s = r->nvme_bytes_per_step / (*nvme * 1e9);
    const double own =
        std::max({compute, r->h2d_bytes_per_step / link, r->d2h_bytes_per_step / link, nvme_s});
    if (depth == 0) base = r->step_seconds;
    const int shown = depth >= 0 ? depth : static_cast<int>((*rt)->config().prefetch_depth);
    std::printf("%6d %10.1f %10.1f %8.2f %10.1f %8.2f %11.2fx %8llu %8llu %10llu\n", shown,
                r->step_seconds * 1e3, minimum * 1e3, r->step_seconds / minimum, own * 1e3,
                r->step_seconds / own, base > 0 ? base / r->step_seconds : 0.0,
                static_cast<unsigned long long>(r->stats.acquire_hits),
                static_cast<unsigned long long>(r->stats.acquire_misses),
                static_cast<unsigned long long>(r->stats.evictions));
  }
  return 0;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
