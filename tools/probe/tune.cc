#include "tools/probe/tune.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/runtime/runtime.h"
#include "tools/shared/step_workload.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kBetter = 1.03;  // a candidate must beat the current value by 3%

class Budget {
 public:
  explicit Budget(double seconds) : seconds_(seconds), start_(Clock::now()) {}
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // Whether `fraction` of the budget is still unspent.
  bool Left(double fraction) const { return elapsed() < seconds_ * fraction; }

 private:
  double seconds_;
  Clock::time_point start_;
};

absl::StatusOr<Config> WithSettings(const Config& base, uint32_t block, uint32_t depth,
                                    uint32_t threads, std::optional<uint32_t> prefetch) {
  ConfigOverrides o;
  o.io_block_size = block;
  o.io_queue_depth = depth;
  o.io_threads = threads;
  if (prefetch.has_value()) o.prefetch_depth = *prefetch;
  // The step workload's own budgets: HBM for a third of the layers, room below for all.
  o.hbm_bytes = SizeSetting{128ull << 20, 0};
  o.dram_bytes = SizeSetting{(12ull * 32 + 512) << 20, 0};
  o.nvme_bytes = SizeSetting{(12ull * 16 + 512) << 20, 0};
  o.placement = Placement::kZeroInfinity;
  std::string paths;
  for (const auto& p : base.nvme_paths) absl::StrAppend(&paths, paths.empty() ? "" : ":", p);
  o.nvme_paths = paths;
  o.io_engine = base.io_engine;
  o.device = base.device;
  o.cuda_device = base.cuda_device;
  // The rank on the node picks the device and shares percentage budgets, as in `base`.
  o.local_rank = base.local_rank;
  o.local_world_size = base.local_world_size;
  o.emu_link_gbps = base.emu_link_gbps;
  o.trace = std::string();
  // Only the overrides and defaults: the environment is already folded into `base`.
  return LoadConfig(o, [](const char*) { return std::optional<std::string>(); }, {});
}

absl::StatusOr<StepResult> Step(const Config& base, const IoPoint& io, uint32_t depth,
                                double compute_ms) {
  auto cfg = WithSettings(base, io.block_size, io.queue_depth, io.threads, depth);
  if (!cfg.ok()) return cfg.status();
  auto rt = Runtime::Create(*cfg);
  if (!rt.ok()) return rt.status();
  StepWorkload w;
  w.compute_ms = compute_ms;
  w.steps = 4;
  return RunSteps(**rt, w);
}

}  // namespace

absl::StatusOr<TuneResult> Tune(const Config& base, const TuneOptions& options,
                                const ProgressFn& progress) {
  Budget budget(options.budget_seconds);
  TuneResult r;
  // Whole stripes of the largest candidate block on every path.
  const uint64_t unit = (8ull << 20) * base.nvme_paths.size();
  auto sweep = IoSweep::Create(
      base.nvme_paths, std::max<uint64_t>(options.io_bytes / unit, 1) * unit, base.io_engine);
  if (!sweep.ok()) return sweep.status();
  IoSweep& s = **sweep;

  // Stage 1, I/O: coordinate search from the effective settings; 60% of the budget.
  auto measure = [&](uint32_t b, uint32_t q, uint32_t t) -> absl::StatusOr<IoPoint> {
    progress(absl::StrFormat("tune: I/O block %s, queue depth %u, %u thread(s)",
                             SizeSetting{b, 0}.ToString(), q, t));
    auto p = s.Measure(b, q, t, 3);
    if (p.ok()) r.io_tried.push_back(*p);
    return p;
  };
  auto best = measure(base.io_block_size, base.io_queue_depth, base.io_threads);
  if (!best.ok()) return best.status();
  r.engine = s.engine();
  IoPoint cur = *best;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::vector<uint32_t> blocks = {256u << 10, 512u << 10, 1u << 20,
                                        2u << 20,   4u << 20,   8u << 20};
  const std::vector<uint32_t> depths = {4, 8, 16, 32, 64, 128};
  std::vector<uint32_t> threads = {1, 2, 4};
  threads.erase(
      std::remove_if(threads.begin(), threads.end(), [&](uint32_t t) { return t > cores; }),
      threads.end());
  for (int coord = 0; coord < 3; ++coord) {
    const auto& values = coord == 0 ? blocks : coord == 1 ? depths : threads;
    for (uint32_t v : values) {
      if (!budget.Left(0.6)) {
        r.budget_exhausted = true;
        break;
      }
      uint32_t b = cur.block_size, q = cur.queue_depth, t = cur.threads;
      (coord == 0 ? b : coord == 1 ? q : t) = v;
      if (b == cur.block_size && q == cur.queue_depth && t == cur.threads) continue;
      auto p = measure(b, q, t);
      if (absl::IsInvalidArgument(p.status())) continue;  // below the alignment: not a candidate
      if (!p.ok()) return p.status();
      if (p->combined_gbps() >= cur.combined_gbps() * kBetter) cur = *p;
    }
  }

  // Stage 2, prefetch depth, on the I/O settings found. Compute per layer is calibrated to the
  // transfer time of a step without prefetching, the balance where prefetching matters most.
  r.depth_default = base.prefetch_depth;
  r.depth_tuned = base.prefetch_depth;
  progress("tune: calibrating the step workload");
  {
    auto calib = Step(base, cur, 0, 0);
    if (!calib.ok()) return calib.status();
    r.compute_ms = calib->step_seconds * 1e3 / (3 * StepWorkload{}.layers);
  }
  double default_step = 0;
  for (uint32_t d : {base.prefetch_depth, 1u, 2u, 4u, 8u, 16u}) {
    bool seen = false;
    for (const auto& [dd, sec] : r.depth_tried) seen = seen || dd == d;
    if (seen) continue;
    if (!budget.Left(0.9)) {
      r.budget_exhausted = true;
      break;
    }
    progress(absl::StrFormat("tune: prefetch depth %u", d));
    auto st = Step(base, cur, d, r.compute_ms);
    if (!st.ok()) return st.status();
    r.depth_tried.push_back({d, st->step_seconds});
    if (d == base.prefetch_depth) default_step = st->step_seconds;
  }
  // The shallowest depth within 3% of the fastest: prefetching ties up HBM.
  double fastest = default_step;
  for (const auto& [d, sec] : r.depth_tried) fastest = std::min(fastest, sec);
  if (default_step > fastest * kBetter) {
    uint32_t pick = base.prefetch_depth;
    double pick_sec = default_step;
    for (const auto& [d, sec] : r.depth_tried) {
      if (sec <= fastest * kBetter && (pick_sec > fastest * kBetter || d < pick)) {
        pick = d;
        pick_sec = sec;
      }
    }
    r.depth_tuned = pick;
  }
  // A step is noisy: a new depth must win again, twice, against the current one, interleaved.
  if (r.depth_tuned != base.prefetch_depth) {
    int wins = 0;
    for (int i = 0; i < 2; ++i) {
      progress(absl::StrFormat("tune: prefetch depth %u against %u, recheck %d of 2", r.depth_tuned,
                               base.prefetch_depth, i + 1));
      auto a = Step(base, cur, base.prefetch_depth, r.compute_ms);
      if (!a.ok()) return a.status();
      auto b = Step(base, cur, r.depth_tuned, r.compute_ms);
      if (!b.ok()) return b.status();
      if (b->step_seconds * kBetter <= a->step_seconds) ++wins;
    }
    if (wins < 2) {
      r.depth_rejected = r.depth_tuned;
      r.depth_tuned = base.prefetch_depth;
    }
  }

  // Stage 3: defaults against the tuned I/O settings, interleaved, three pairs.
  std::vector<IoPoint> def, tuned;
  for (int i = 0; i < 3; ++i) {
    progress(absl::StrFormat("tune: defaults against tuned, pair %d of 3", i + 1));
    auto a = s.Measure(base.io_block_size, base.io_queue_depth, base.io_threads, 3);
    if (!a.ok()) return a.status();
    auto b = s.Measure(cur.block_size, cur.queue_depth, cur.threads, 3);
    if (!b.ok()) return b.status();
    def.push_back(*a);
    tuned.push_back(*b);
  }
  auto median = [](std::vector<IoPoint> v) {
    std::sort(v.begin(), v.end(), [](const IoPoint& x, const IoPoint& y) {
      return x.combined_gbps() < y.combined_gbps();
    });
    return v[v.size() / 2];
  };
  r.io_default = median(def);
  r.io_tuned = median(tuned);
  if (r.io_tuned.combined_gbps() <= r.io_default.combined_gbps()) {
    if (!r.io_tuned.SameSettings(r.io_default)) r.io_rejected = r.io_tuned;
    r.io_tuned = r.io_default;
    r.io_kept_default = true;
  }
  r.seconds = budget.elapsed();
  return r;
}

std::string PointText(const IoPoint& p) {
  return absl::StrFormat("block %s, queue depth %u, %u thread%s: %.2f / %.2f GB/s",
                         SizeSetting{p.block_size, 0}.ToString(), p.queue_depth, p.threads,
                         p.threads == 1 ? "" : "s", p.write_gbps, p.read_gbps);
}

std::string EnvFileText(const TuneResult& r, const Config& base, const std::string& path) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  char date[64] = "";
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string paths;
  for (const auto& p : base.nvme_paths) absl::StrAppend(&paths, paths.empty() ? "" : ":", p);
  std::string out = absl::StrFormat(
      "# tiermem settings from tiermem-probe --tune %s on %s at %s (%.0f s).\n"
      "# Measured for TIERMEM_NVME_PATHS=%s, engine %s. Load it with\n"
      "#   export TIERMEM_ENV_FILE=%s\n"
      "# Variables set in the environment win over the values here. The defaults below are the\n"
      "# settings in effect when the tuner started.\n",
      tm_version_string(), host, date, r.seconds, paths, r.engine, path);
  absl::StrAppendFormat(
      &out, "# DRAM <-> NVMe, write / read GB/s: tuned %.2f / %.2f, defaults %.2f / %.2f%s\n",
      r.io_tuned.write_gbps, r.io_tuned.read_gbps, r.io_default.write_gbps, r.io_default.read_gbps,
      r.io_kept_default && !r.io_rejected ? " (nothing beat the defaults)" : "");
  if (r.io_rejected.has_value()) {
    absl::StrAppendFormat(&out,
                          "# the search's pick (%s) lost the final check against the defaults: "
                          "defaults kept\n",
                          PointText(*r.io_rejected));
  }
  for (const auto& [d, sec] : r.depth_tried) {
    absl::StrAppendFormat(&out, "# step workload, prefetch depth %u: %.1f ms\n", d, sec * 1e3);
  }
  if (r.depth_tried.empty()) {
    absl::StrAppendFormat(&out,
                          "# prefetch depth not measured (the budget ran out first): the setting "
                          "in effect, %u, kept\n",
                          r.depth_tuned);
  }
  if (r.depth_rejected != 0) {
    absl::StrAppendFormat(&out, "# prefetch depth %u looked faster but lost a recheck: kept %u\n",
                          r.depth_rejected, r.depth_tuned);
  }
  absl::StrAppendFormat(&out, "export TIERMEM_IO_BLOCK_SIZE=%s\n",
                        SizeSetting{r.io_tuned.block_size, 0}.ToString());
  absl::StrAppendFormat(&out, "export TIERMEM_IO_QUEUE_DEPTH=%u\n", r.io_tuned.queue_depth);
  absl::StrAppendFormat(&out, "export TIERMEM_IO_THREADS=%u\n", r.io_tuned.threads);
  absl::StrAppendFormat(&out, "export TIERMEM_PREFETCH_DEPTH=%u\n", r.depth_tuned);
  // What a recompute is priced against (tm_tensor_set_recompute): one rate per direction whose
  // round trip, 2 * bytes / rate, is the measured write plus the measured read (their harmonic
  // mean).
  const double w = r.io_tuned.write_gbps, rd = r.io_tuned.read_gbps;
  if (std::isfinite(w) && std::isfinite(rd) && w > 0 && rd > 0) {
    absl::StrAppendFormat(&out, "export TIERMEM_NVME_GBPS=%.3f\n", 2.0 / (1.0 / w + 1.0 / rd));
  }
  return out;
}

}  // namespace tiermem
