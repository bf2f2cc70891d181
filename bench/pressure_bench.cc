// pressure_bench: a ZeRO-Infinity style training step under memory pressure, with tensors of
// several sizes. Parameters (a different size per layer) live on NVMe; forward acquires each in
// HBM, "computes", writes a fresh activation (another size per layer, created anew every step
// as a framework does) and offloads it to NVMe (all but the last layer's); backward walks back,
// re-acquiring activations and parameters and computing twice as long. Every byte is written and
// checked on the step's thread, inside the wall-clock step time; that time joins the compute term
// of the bounds. For HBM budgets of 2, 3 and 4 layers and each prefetch depth it prints the step
// time against two overlap bounds
//   max(compute + checking, link bytes / link bandwidth (each direction),
//       NVMe read bytes / read bandwidth + NVMe write bytes / write bandwidth)
// with the NVMe bandwidths measured through the runtime in the same run:
//   minimum: the least bytes any correct schedule must move at this HBM size (MinimumBytes);
//   own: the bytes this run moved (steps after the first); redundant moves raise only this one.
// "/ slept" is the step against the minimum bound with the compute term as the step's thread
// slept it (a loaded machine wakes a sleeper late, tiermem or not): the share the moves cost.
// The emulated compute sleeps with a 1 ns timer slack and spins its last 200 us, so that on a
// quiet machine it takes its nominal time, as a GPU's kernels do.
// Each ratio sets every step after the first against the bound with that step's own checking,
// and is the median of those ratios (then the median over --repeats runs); step, check and bound
// in ms are the median run's medians.
// PRESSURE_BENCH_TERMS=1 also prints the bytes (with the HBM handed on behind copies down and
// moved up behind them, TIERMEM_HBM_HAND_ON) and where the step's thread spent its time.
// Inclusive DRAM (TIERMEM_DRAM_INCLUSIVE) on and off side by side, each row the median step of
// --repeats runs, interleaved (every combination once per round) so that a drifting disk or a
// loaded machine weighs on both alike. --sizes large: a second workload, parameters and
// activations of 12-40 MiB, all different.
//   pressure_bench [--layers N] [--compute-ms T] [--link-gbps G] [--steps S]
//                  [--hbm-layers 2,3,4] [--depths 0,1,2,4,8] [--inclusive on,off]
//                  [--repeats R] [--sizes mixed|large]
//                  [--hbm-allocator slab|mapped|caching]
// --hbm-allocator: HBM in one slab (the default, TIERMEM_HBM_LAYOUT=slab), in chunks mapped copy
// by copy (TIERMEM_HBM_LAYOUT=mapped), or from a caching allocator through tm_config.device_alloc
// (the path tiermem.torch takes with PyTorch's allocator on a GPU).
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1 << 20;

struct Options {
  int layers = 8;
  double compute_ms = 4;  // forward, per layer; backward is twice that
  double link_gbps = 5;
  int steps = 6;
  std::vector<int> hbm_layers = {2, 3, 4};
  std::vector<int> depths = {0, 1, 2, 4, 8};
  std::vector<bool> inclusive = {true, false};
  int repeats = 1;
};

// Sizes that differ per layer and are not powers of two: fragmentation is real. Two workloads:
// "mixed" (the default) and "large" (--sizes large), chosen once in Main.
constexpr uint64_t kMixedParamMib[] = {12, 7, 9, 14, 8, 11, 6, 10};
constexpr uint64_t kMixedActMib[] = {5, 9, 6, 4, 8, 7, 10, 5};
constexpr uint64_t kLargeParamMib[] = {24, 13, 37, 18, 29, 15, 40, 21};
constexpr uint64_t kLargeActMib[] = {32, 17, 12, 38, 26, 19, 35, 23};
const uint64_t* g_param_mib = kMixedParamMib;
const uint64_t* g_act_mib = kMixedActMib;
uint64_t ParamBytes(int l) {
  return g_param_mib[l % 8] * kMiB + 4097 * static_cast<uint64_t>(l + 1);
}
uint64_t ActBytes(int l) { return g_act_mib[l % 8] * kMiB + 513 * static_cast<uint64_t>(l + 1); }

// --hbm-allocator caching: HBM copies come from a framework's allocator (tm_config.device_alloc)
// instead of tiermem's slab, as tiermem.torch does with PyTorch's caching allocator on a GPU.
// This one stands in for it on the emulated device: freed blocks are kept by size and handed out
// again (each step asks for the same sizes), touched once when first made. The slab places every
// copy in one address range, where a request needs a hole of its size; here there is no
// adjacency, so the two side by side show what contiguity in the slab costs.
bool g_caching_allocator = false;
std::optional<HbmLayout> g_layout;  // --hbm-allocator slab or mapped; unset: the environment's
std::mutex g_cache_mu;
std::multimap<size_t, void*>* g_cache = new std::multimap<size_t, void*>;  // never freed

void* CachingAlloc(void*, size_t bytes, int32_t, void*) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    if (auto it = g_cache->find(bytes); it != g_cache->end()) {
      void* p = it->second;
      g_cache->erase(it);
      return p;
    }
  }
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p != nullptr) std::memset(p, 0, bytes);
  return p;
}

void CachingFree(void*, void* p, size_t bytes, int32_t, void*) {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_cache->emplace(bytes, p);
}

// The emulated compute's last stretch, spun rather than slept (see Run).
constexpr auto kSpin = std::chrono::microseconds(200);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

#define BENCH_RETURN_IF_ERROR(expr) \
  do {                              \
    absl::Status s_ = (expr);       \
    if (!s_.ok()) return s_;        \
  } while (0)

absl::StatusOr<std::unique_ptr<Runtime>> Make(const Options& o, uint64_t hbm, int depth,
                                              bool inclusive) {
  ConfigOverrides c;
  if (g_caching_allocator) {
    c.device_allocator.alloc = CachingAlloc;
    c.device_allocator.free = CachingFree;
  }
  c.hbm_layout = g_layout;
  c.device = DeviceKind::kEmulated;
  c.emu_link_gbps = o.link_gbps;
  c.hbm_bytes = SizeSetting{hbm, 0};
  uint64_t all = 0;
  for (int l = 0; l < o.layers; ++l) all += ParamBytes(l) + ActBytes(l);
  c.dram_bytes = SizeSetting{all + 256 * kMiB, 0};
  c.nvme_bytes = SizeSetting{2 * all + 512 * kMiB, 0};
  if (depth >= 0) c.prefetch_depth = static_cast<uint32_t>(depth);
  c.placement = Placement::kZeroInfinity;
  auto cfg = LoadConfig(c, ProcessEnvironment(), ProcessTiermemVariables());
  if (!cfg.ok()) return cfg.status();
  cfg->dram_inclusive = inclusive;  // the side being measured, whatever the environment says
  return Runtime::Create(*cfg);
}

// The runtime path's NVMe bandwidth, write and read, median of 5 of 256 MiB.
absl::Status MeasureNvme(Runtime& rt, double* write_gbps, double* read_gbps) {
  const uint64_t bytes = 256 * kMiB;
  auto h = rt.CreateTensor({bytes, TM_CLASS_OTHER, TM_TIER_DRAM, "probe"});
  if (!h.ok()) return h.status();
  std::vector<char> data(bytes, 1);
  BENCH_RETURN_IF_ERROR(rt.Write(*h, 0, data.data(), bytes));
  std::vector<double> w, r;
  for (int i = 0; i < 5; ++i) {
    // Dirty in DRAM again (its NVMe copy is dropped), so that the offload writes it all.
    auto d = rt.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr);
    if (!d.ok()) return d.status();
    BENCH_RETURN_IF_ERROR(rt.Release(*h, TM_TIER_DRAM));
    auto t0 = Clock::now();
    BENCH_RETURN_IF_ERROR(rt.Offload(*h, TM_TIER_NVME));
    BENCH_RETURN_IF_ERROR(rt.Sync(*h));
    w.push_back(Seconds(Clock::now() - t0));
    t0 = Clock::now();
    auto p = rt.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ, nullptr);
    if (!p.ok()) return p.status();
    r.push_back(Seconds(Clock::now() - t0));
    BENCH_RETURN_IF_ERROR(rt.Release(*h, TM_TIER_DRAM));
  }
  std::sort(w.begin(), w.end());
  std::sort(r.begin(), r.end());
  *write_gbps = static_cast<double>(bytes) / w[2] / 1e9;
  *read_gbps = static_cast<double>(bytes) / r[2] / 1e9;
  return rt.DestroyTensor(*h);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Result {
  double step = 0;      // median wall seconds of the steps after the first
  double checking = 0;  // median seconds of those steps spent writing and checking bytes
  // Where the step thread's time went (medians, PRESSURE_BENCH_TERMS): asleep for "compute"
  // (the nominal compute plus the oversleep of a loaded machine), waiting in Acquire, and in
  // the other calls (create, release, offload, destroy, step marks).
  double slept = 0, acquiring = 0, other_calls = 0;
  double h2d = 0, d2h = 0;  // link bytes per step
  double nvme_read = 0, nvme_write = 0;
  double slid = 0;  // bytes per step slid within HBM (compaction, device-to-device)
  // Bytes per step of HBM handed on behind copies down, and moved up behind them (vacate.cc).
  double handed_on = 0, behind = 0;
  // Each step after the first: wall, checking and slept seconds. Its ratios to the bounds are
  // taken step by step, each step against the bound with its own checking (StepRatio).
  std::vector<double> steps, checks, sleeps;
  tm_stats stats{};
};

// A byte pattern that differs per layer, step and position, checked whole.
void Fill(char* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = (seed * 0x9E3779B97F4A7C15ull) ^ i;
    std::memcpy(p + i, &v, 8);
  }
  for (uint64_t i = n & ~7ull; i < n; ++i) p[i] = static_cast<char>(seed + i);
}
bool Check(const char* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = (seed * 0x9E3779B97F4A7C15ull) ^ i;
    if (std::memcmp(p + i, &v, 8) != 0) return false;
  }
  for (uint64_t i = n & ~7ull; i < n; ++i) {
    if (p[i] != static_cast<char>(seed + i)) return false;
  }
  return true;
}

absl::StatusOr<Result> Run(Runtime& rt, const Options& o) {
  std::vector<uint64_t> params;
  for (int l = 0; l < o.layers; ++l) {
    auto h = rt.CreateTensor(
        {ParamBytes(l), TM_CLASS_PARAM, TM_TIER_BY_PLACEMENT, "param" + std::to_string(l)});
    if (!h.ok()) return h.status();
    std::vector<char> init(ParamBytes(l));
    Fill(init.data(), init.size(), 1000 + l);
    BENCH_RETURN_IF_ERROR(rt.Write(*h, 0, init.data(), init.size()));  // lands on NVMe
    params.push_back(*h);
  }
  const auto fwd = std::chrono::duration<double, std::milli>(o.compute_ms);
  // The emulated compute sleeps its time, not its time plus the kernel's default timer slack
  // (50 us a sleep: 1.4 ms a step of 16 sleeps on the development VM), which is this bench's
  // error, not tiermem's. This thread only (the runtime's threads keep theirs); its old slack
  // comes back when the run ends.
  const int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  struct RestoreSlack {
    int ns;
    ~RestoreSlack() {
      if (ns > 0) (void)prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(ns), 0, 0, 0);
    }
  } restore_slack{old_slack};
  const auto bwd = 2 * fwd;
  std::vector<double> times, checks, sleeps, acquires;
  tm_stats first{};
  for (int step = 0; step < o.steps; ++step) {
    if (step == 1) first = rt.Stats();
    BENCH_RETURN_IF_ERROR(rt.StepBegin());
    const auto t0 = Clock::now();
    Clock::duration checking{};  // the bench's own byte checks, not the step's
    Clock::duration slept{}, acquiring{};
    auto compute = [&](auto d) {
      const auto s0 = Clock::now();
      const auto until = s0 + std::chrono::duration_cast<Clock::duration>(d);
      // Asleep until shortly before the end, then spinning to it: a wake-up lands tens of
      // microseconds late on a loaded VM (16 sleeps a step), which a GPU's kernels do not.
      std::this_thread::sleep_until(until - kSpin);
      while (Clock::now() < until) {
      }
      slept += Clock::now() - s0;
    };
    auto acquire = [&](uint64_t h, tm_access access) {
      const auto a0 = Clock::now();
      auto p = rt.Acquire(h, TM_TIER_HBM, access, nullptr);
      acquiring += Clock::now() - a0;
      return p;
    };
    std::vector<uint64_t> acts;
    for (int l = 0; l < o.layers; ++l) {
      auto p = acquire(params[l], TM_ACCESS_READ);
      if (!p.ok()) return p.status();
      auto c0 = Clock::now();
      if (!Check(static_cast<char*>(*p), ParamBytes(l), 1000 + l)) {
        return absl::DataLossError("a parameter came back with the wrong bytes");
      }
      checking += Clock::now() - c0;
      compute(fwd);
      auto h = rt.CreateTensor(
          {ActBytes(l), TM_CLASS_ACTIVATION, TM_TIER_HBM, "act" + std::to_string(l)});
      if (!h.ok()) return h.status();
      acts.push_back(*h);
      auto a = acquire(*h, TM_ACCESS_WRITE);
      if (!a.ok()) return a.status();
      c0 = Clock::now();
      Fill(static_cast<char*>(*a), ActBytes(l), step * 100 + l);  // the forward's output
      checking += Clock::now() - c0;
      BENCH_RETURN_IF_ERROR(rt.Release(*h, TM_TIER_HBM));
      // The last layer's activation is used by backward at once: offloading it would only
      // bring it straight back (offload engines keep it too).
      if (l + 1 < o.layers) BENCH_RETURN_IF_ERROR(rt.Offload(*h, TM_TIER_NVME));
      BENCH_RETURN_IF_ERROR(rt.Release(params[l], TM_TIER_HBM));
    }
    for (int l = o.layers - 1; l >= 0; --l) {
      auto a = acquire(acts[l], TM_ACCESS_READ);
      if (!a.ok()) return a.status();
      auto p = acquire(params[l], TM_ACCESS_READ);
      if (!p.ok()) return p.status();
      auto c0 = Clock::now();
      if (!Check(static_cast<char*>(*a), ActBytes(l), step * 100 + l) ||
          !Check(static_cast<char*>(*p), ParamBytes(l), 1000 + l)) {
        return absl::DataLossError("an activation or parameter came back with the wrong bytes");
      }
      checking += Clock::now() - c0;
      compute(bwd);
      BENCH_RETURN_IF_ERROR(rt.Release(params[l], TM_TIER_HBM));
      BENCH_RETURN_IF_ERROR(rt.Release(acts[l], TM_TIER_HBM));
      BENCH_RETURN_IF_ERROR(rt.DestroyTensor(acts[l]));
    }
    BENCH_RETURN_IF_ERROR(rt.StepEnd());
    times.push_back(Seconds(Clock::now() - t0));
    checks.push_back(Seconds(checking));
    sleeps.push_back(Seconds(slept));
    acquires.push_back(Seconds(acquiring));
  }
  BENCH_RETURN_IF_ERROR(rt.SyncAll());
  Result r;
  r.stats = rt.Stats();
  const double n = o.steps - 1;
  auto per_step = [&](int from, int to) {
    return static_cast<double>(r.stats.bytes_moved[from][to] - first.bytes_moved[from][to]) / n;
  };
  r.h2d = per_step(TM_TIER_DRAM, TM_TIER_HBM);
  r.d2h = per_step(TM_TIER_HBM, TM_TIER_DRAM);
  r.nvme_read = per_step(TM_TIER_NVME, TM_TIER_DRAM);
  r.nvme_write = per_step(TM_TIER_DRAM, TM_TIER_NVME);
  r.slid = static_cast<double>(r.stats.relocation_bytes - first.relocation_bytes) / n;
  r.handed_on = static_cast<double>(r.stats.hbm_handed_on_bytes - first.hbm_handed_on_bytes) / n;
  r.behind = static_cast<double>(r.stats.moves_behind_bytes - first.moves_behind_bytes) / n;
  auto median_after_first = [](std::vector<double> v) {
    v.erase(v.begin());
    return Median(std::move(v));
  };
  r.step = median_after_first(times);
  r.checking = median_after_first(checks);
  r.slept = median_after_first(sleeps);
  r.acquiring = median_after_first(acquires);
  std::vector<double> others;
  for (size_t i = 0; i < times.size(); ++i) {
    others.push_back(times[i] - checks[i] - sleeps[i] - acquires[i]);
  }
  r.other_calls = median_after_first(others);
  r.steps.assign(times.begin() + 1, times.end());
  r.checks.assign(checks.begin() + 1, checks.end());
  r.sleeps.assign(sleeps.begin() + 1, sleeps.end());
  for (uint64_t h : params) BENCH_RETURN_IF_ERROR(rt.DestroyTensor(h));
  return r;
}

// The least bytes per step any correct schedule moves with `hbm` bytes of HBM. Every parameter
// and activation is used in backward, and HBM holds at most `hbm` bytes at the turn: the rest
// crosses up during backward. Parameters not in HBM at the step's start (HBM holds at most
// `hbm`) cross up in forward. Activations are made in HBM, and when the last is made beside its
// parameter every one exists: what HBM cannot hold then has left it, down the link, and was
// written to NVMe (the workload offloads to NVMe; the runtime may keep a copy in HBM instead, a
// superseded offload, but a copy that leaves HBM is written). Exclusive DRAM reads those back
// from NVMe. DRAM holds every tensor here, so no other NVMe read is compulsory. A lower bound:
// no schedule can move less (the runtime moves less than the workload's offloads ask for when
// it keeps activations in HBM, so "the offloaded bytes" would not be one).
struct Bytes {
  double h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;
};
// With inclusive DRAM, DRAM may keep each activation it wrote to NVMe, so reading it back from
// NVMe is not compulsory.
Bytes MinimumBytes(const Options& o, uint64_t hbm, bool inclusive) {
  double params = 0, acts = 0;
  for (int l = 0; l < o.layers; ++l) params += static_cast<double>(ParamBytes(l));
  for (int l = 0; l < o.layers; ++l) acts += static_cast<double>(ActBytes(l));
  const double h = static_cast<double>(hbm);
  Bytes b;
  b.h2d = std::max(0.0, params - h) + std::max(0.0, params + acts - h);
  b.d2h = std::max(0.0, acts + static_cast<double>(ParamBytes(o.layers - 1)) - h);
  b.nvme_read = b.nvme_write = b.d2h;
  if (inclusive) b.nvme_read = 0;
  return b;
}

// max(compute, each link direction, NVMe read + write) in seconds; *by names the largest term.
double Bound(double compute, const Bytes& b, double link, double nvme_r, double nvme_w,
             const char** by) {
  const double nvme = b.nvme_read / (nvme_r * 1e9) + b.nvme_write / (nvme_w * 1e9);
  const double terms[] = {compute, b.h2d / link, b.d2h / link, nvme};
  static constexpr const char* kNames[] = {"compute", "h2d", "d2h", "nvme"};
  const int i = static_cast<int>(std::max_element(terms, terms + 4) - terms);
  *by = kNames[i];
  return terms[i];
}

// A run's step against a bound, like for like: each step after the first against the bound with
// that step's own checking (and, `as_slept`, its own sleeps), the median of those ratios. The
// median step over the bound of the median checking would set one step's wall time against
// another step's checking: checking swings by tens of ms from step to step on a loaded VM.
double StepRatio(const Result& r, const Bytes& b, double compute, double link, double nvme_r,
                 double nvme_w, bool as_slept) {
  std::vector<double> ratios;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const char* by = nullptr;
    const double c = as_slept ? std::max(compute, r.sleeps[i]) : compute;
    ratios.push_back(r.steps[i] / Bound(c + r.checks[i], b, link, nvme_r, nvme_w, &by));
  }
  return Median(std::move(ratios));
}

// One row of the table: the runs against both bounds (and the bytes, with PRESSURE_BENCH_TERMS).
// Times, bytes and counts are the median run's (by step time); each ratio is the median over the
// runs of StepRatio.
void PrintRow(const Options& o, int k, uint64_t hbm, int depth, bool inclusive,
              const std::vector<Result>& runs, const Bytes& least, double compute, double nvme_r,
              double nvme_w, double base) {
  const Result& r = runs[runs.size() / 2];
  const double link = o.link_gbps * 1e9;
  auto ratio = [&](auto bytes_of, bool as_slept) {
    std::vector<double> v;
    for (const Result& run : runs) {
      v.push_back(StepRatio(run, bytes_of(run), compute, link, nvme_r, nvme_w, as_slept));
    }
    return Median(std::move(v));
  };
  auto minimum = [&](const Result&) { return least; };
  auto own = [](const Result& run) {
    return Bytes{run.h2d, run.d2h, run.nvme_read, run.nvme_write};
  };
  const Bytes moved = own(r);
  const char* min_by = nullptr;
  const char* own_by = nullptr;
  const double work = compute + r.checking;
  const double min_bound = Bound(work, least, link, nvme_r, nvme_w, &min_by);
  const double own_bound = Bound(work, moved, link, nvme_r, nvme_w, &own_by);
  if (getenv("PRESSURE_BENCH_TERMS") != nullptr) {
    std::printf(
        "  bytes MiB/step (minimum / moved): h2d %.0f / %.0f, d2h %.0f / %.0f, NVMe read "
        "%.0f / %.0f, NVMe write %.0f / %.0f; slid in HBM %.0f; HBM handed on %.0f, moved up "
        "behind %.0f; minimum bound by %s\n",
        least.h2d / kMiB, r.h2d / kMiB, least.d2h / kMiB, r.d2h / kMiB, least.nvme_read / kMiB,
        r.nvme_read / kMiB, least.nvme_write / kMiB, r.nvme_write / kMiB, r.slid / kMiB,
        r.handed_on / kMiB, r.behind / kMiB, min_by);
    std::printf(
        "  step ms: slept %.1f (compute %.1f), checking %.1f, in acquire %.1f, in other "
        "calls %.1f; median step / minimum bound at the median checking %.3f\n",
        r.slept * 1e3, compute * 1e3, r.checking * 1e3, r.acquiring * 1e3, r.other_calls * 1e3,
        r.step / min_bound);
  }
  std::printf(
      "%2d (%3.0f MiB) %3d %4s %8.1f %7.1f %8.1f %6.2f %7.2f %8.1f %6.2f %8s %9.2fx %7llu %8llu "
      "%8llu %6llu %8.0f %8.0f\n",
      k, static_cast<double>(hbm) / kMiB, depth, inclusive ? "on" : "off", r.step * 1e3,
      r.checking * 1e3, min_bound * 1e3, ratio(minimum, false), ratio(minimum, true),
      own_bound * 1e3, ratio(own, false), own_by, base > 0 ? base / r.step : 0.0,
      static_cast<unsigned long long>(r.stats.acquire_misses),
      static_cast<unsigned long long>(r.stats.evictions),
      static_cast<unsigned long long>(r.stats.prefetches_dropped),
      static_cast<unsigned long long>(r.stats.demand_waits), r.nvme_read / kMiB,
      static_cast<double>(r.stats.clean_read_bytes) / kMiB / o.steps);
}

std::vector<int> IntList(const std::string& v) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(v, ','))
    out.push_back(std::atoi(std::string(p).c_str()));
  return out;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    double d = 0;
    if (k == "--depths") {
      o.depths = IntList(v);
    } else if (k == "--hbm-layers") {
      o.hbm_layers = IntList(v);
    } else if (k == "--inclusive") {
      o.inclusive.clear();
      for (absl::string_view p : absl::StrSplit(v, ',')) {
        if (p != "on" && p != "off") {
          std::fprintf(stderr, "pressure_bench: --inclusive takes on, off or on,off\n");
          return 2;
        }
        o.inclusive.push_back(p == "on");
      }
    } else if (k == "--sizes") {
      if (v != "mixed" && v != "large") {
        std::fprintf(stderr, "pressure_bench: --sizes takes mixed or large\n");
        return 2;
      }
      g_param_mib = v == "large" ? kLargeParamMib : kMixedParamMib;
      g_act_mib = v == "large" ? kLargeActMib : kMixedActMib;
    } else if (k == "--hbm-allocator") {
      if (v != "slab" && v != "mapped" && v != "caching") {
        std::fprintf(stderr, "pressure_bench: --hbm-allocator takes slab, mapped or caching\n");
        return 2;
      }
      g_caching_allocator = v == "caching";
      if (v == "slab" || v == "mapped") {
        g_layout = v == "slab" ? HbmLayout::kSlab : HbmLayout::kMapped;
      }
    } else if (!absl::SimpleAtod(v, &d)) {
      std::fprintf(stderr, "pressure_bench: bad value %s for %s\n", v.c_str(), k.c_str());
      return 2;
    } else if (k == "--layers") {
      o.layers = std::max(1, static_cast<int>(d));
    } else if (k == "--compute-ms") {
      o.compute_ms = d;
    } else if (k == "--link-gbps") {
      o.link_gbps = d;
    } else if (k == "--steps") {
      o.steps = std::max(2, static_cast<int>(d));
    } else if (k == "--repeats") {
      o.repeats = std::max(1, static_cast<int>(d));
    } else {
      std::fprintf(stderr, "pressure_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  uint64_t widest = 0;
  for (int l = 0; l < o.layers; ++l) widest = std::max(widest, ParamBytes(l) + ActBytes(l));
  auto probe = Make(o, widest, 0, /*inclusive=*/false);  // reads must come from NVMe
  if (!probe.ok()) {
    std::fprintf(stderr, "pressure_bench: %s\n", std::string(probe.status().message()).c_str());
    return 1;
  }
  double nvme_w = 0, nvme_r = 0;
  if (auto s = MeasureNvme(**probe, &nvme_w, &nvme_r); !s.ok()) {
    std::fprintf(stderr, "pressure_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const std::string layout =
      g_caching_allocator
          ? "a caching allocator (device_alloc)"
          : "tiermem's " + (*probe)->config().Value("TIERMEM_HBM_LAYOUT").value_or("?") + " layout";
  probe->reset();
  const double compute = o.layers * o.compute_ms * 3 / 1e3;
  const bool large = g_param_mib == kLargeParamMib;
  std::printf(
      "pressure_bench: %d layers, parameters %s MiB on NVMe, activations %s MiB offloaded to "
      "NVMe (all sizes odd); HBM from %s; median step of %d interleaved run(s)\n",
      o.layers, large ? "12-40" : "6-14", large ? "12-38" : "4-10", layout.c_str(), o.repeats);
  std::printf(
      "  compute %.1f ms/step; link %.1f GB/s each way; NVMe (measured, runtime path) "
      "write %.2f, read %.2f GB/s\n\n",
      compute * 1e3, o.link_gbps, nvme_w, nvme_r);
  std::printf("%-12s %3s %4s %8s %7s %8s %6s %7s %8s %6s %8s %10s %7s %8s %8s %6s %8s %8s\n", "hbm",
              "depth", "incl", "step ms", "check", "min ms", "/ min", "/ slept", "own ms", "/ own",
              "own by", "vs depth 0", "misses", "evicted", "dropped", "waits", "nvme rd",
              "clean rd");
  // Every combination once per round, the rounds one after another: the runs interleave.
  struct Key {
    int k, depth;
    bool inclusive;
  };
  std::vector<Key> keys;
  for (int k : o.hbm_layers) {
    for (int depth : o.depths) {
      for (bool inclusive : o.inclusive) keys.push_back({k, depth, inclusive});
    }
  }
  std::vector<std::vector<Result>> results(keys.size());
  bool ok = true;
  for (int round = 0; round < o.repeats; ++round) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t hbm = static_cast<uint64_t>(keys[i].k) * widest;
      auto rt = Make(o, hbm, keys[i].depth, keys[i].inclusive);
      if (!rt.ok()) {
        std::fprintf(stderr, "pressure_bench: %s\n", std::string(rt.status().message()).c_str());
        return 1;
      }
      auto r = Run(**rt, o);
      if (!r.ok()) {
        std::printf("%4d layers %6d %4s   FAILED: %s\n", keys[i].k, keys[i].depth,
                    keys[i].inclusive ? "on" : "off", std::string(r.status().message()).c_str());
        ok = false;
        continue;
      }
      results[i].push_back(*r);
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<Result>& runs = results[i];
    if (runs.empty()) continue;
    std::sort(runs.begin(), runs.end(),
              [](const Result& a, const Result& b) { return a.step < b.step; });
    double depth0 = 0;
    for (size_t j = 0; j < keys.size(); ++j) {
      if (keys[j].k == keys[i].k && keys[j].inclusive == keys[i].inclusive && keys[j].depth == 0 &&
          !results[j].empty()) {
        depth0 = results[j][results[j].size() / 2].step;
      }
    }
    const uint64_t hbm = static_cast<uint64_t>(keys[i].k) * widest;
    PrintRow(o, keys[i].k, hbm, keys[i].depth, keys[i].inclusive, runs,
             MinimumBytes(o, hbm, keys[i].inclusive), compute, nvme_r, nvme_w, depth0);
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
