// The triad, as STREAM runs it: static slices per thread, first touch by the thread that uses
// the slice, best of several passes; and the CPU Adam step the planner prices.
#include "tools/probe/probe_dram.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/cpu_adam.h"
#include "lib/tiers/tier_space.h"

namespace tiermem {
namespace {

// Runs fn(begin, end) over [0, n) split evenly over `threads` threads.
template <typename Fn>
void Parallel(size_t n, int threads, Fn fn) {
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    const size_t begin = n * t / threads, end = n * (t + 1) / threads;
    pool.emplace_back([=] { fn(begin, end); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

absl::StatusOr<DramMeasurement> DramTriad(uint64_t bytes, int repeats) {
  const size_t n = std::max<uint64_t>(bytes / sizeof(double), 1024);
  DramMeasurement m;
  m.bytes = n * sizeof(double);
  m.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m.repeats = std::max(repeats, 1);
  std::unique_ptr<double[]> a(new (std::nothrow) double[n]);
  std::unique_ptr<double[]> b(new (std::nothrow) double[n]);
  std::unique_ptr<double[]> c(new (std::nothrow) double[n]);
  if (!a || !b || !c) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("dram triad: cannot allocate 3 arrays of %u bytes", m.bytes));
  }
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
  Parallel(n, m.threads, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      pa[i] = 0;
      pb[i] = static_cast<double>(i % 1000);
      pc[i] = 2;
    }
  });
  const double q = 3;
  double best = 0;
  for (int r = 0; r <= m.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Parallel(n, m.threads, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) pa[i] = pb[i] + q * pc[i];
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 || s <= 0) continue;  // the first pass pays for page faults and cold caches
    best = std::max(best, 3.0 * static_cast<double>(m.bytes) / s / 1e9);
  }
  for (size_t i : {size_t{0}, n / 2, n - 1}) {
    if (pa[i] != static_cast<double>(i % 1000) + q * 2) {
      return absl::InternalError(absl::StrFormat("dram triad: element %u is wrong", i));
    }
  }
  m.gbps = best;
  return m;
}

absl::Status DramAdam(uint64_t bytes, DramMeasurement& m) {
  const size_t n = std::max<uint64_t>(bytes / sizeof(float), 1024);
  std::unique_ptr<float[]> arrays[4];
  for (auto& a : arrays) {
    a.reset(new (std::nothrow) float[n]);
    if (!a) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("dram adam: cannot allocate 4 arrays of %u bytes", n * sizeof(float)));
    }
  }
  optim::AdamHyper hyper;
  hyper.weight_decay = 0.01;
  auto opt = optim::AdamOptimizer::Create(hyper, std::max(m.threads, 1), /*numa_node=*/-1);
  if (!opt.ok()) return opt.status();
  optim::AdamSpan span;
  span.param = arrays[0].get();
  span.m = arrays[1].get();
  span.v = arrays[2].get();
  span.grad = arrays[3].get();
  span.n = n;
  // First touch by the pool's threads, in the tiles the step uses (as the step's own first pass
  // would place the state): every array zeroed, the gradient set.
  float* const p = span.param;
  float* const mm = span.m;
  float* const v = span.v;
  float* const g = arrays[3].get();
  Parallel(n, std::max(m.threads, 1), [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      p[i] = 1.0f;
      mm[i] = v[i] = 0.0f;
      g[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
    }
  });
  double best = 0;
  for (int r = 0; r <= m.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = (*opt)->Step(static_cast<uint64_t>(r) + 1, 1.0f, &span, 1); !s.ok()) {
      return s;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 || s <= 0) continue;  // the first step pays for cold caches and the pool's start
    best = std::max(best, 28.0 * static_cast<double>(n) / s / 1e9);
  }
  // After r steps from 1 with a constant gradient, every parameter moved down by about lr per
  // step where the gradient is positive: a kernel that wrote nothing is caught.
  for (size_t i : {size_t{1}, n / 2 + 1, n - 1}) {
    const bool positive = g[i] > 0, negative = g[i] < 0;
    if ((positive && !(p[i] < 1.0f)) || (negative && !(p[i] > 1.0f)) || !std::isfinite(p[i])) {
      return absl::InternalError(absl::StrFormat("dram adam: parameter %u is %g", i, p[i]));
    }
  }
  m.adam_params = n;
  m.adam_gbps = best;
  m.adam_isa = optim::IsaName(optim::ActiveIsa());
  return absl::OkStatus();
}

std::string DramRow(const DramMeasurement& m) {
  std::string row = absl::StrFormat(
      "dram        triad       %8.2f GB/s   (3 arrays of %s, %d thread(s), best of %d)\n", m.gbps,
      HumanBytes(m.bytes), m.threads, m.repeats);
  if (m.adam_gbps > 0) {
    absl::StrAppendFormat(
        &row,
        "dram        adam step   %8.2f GB/s   (28 B/param, %u params, %s, %d thread(s), best of "
        "%d): %.2f ms per 1M params\n",
        m.adam_gbps, m.adam_params, m.adam_isa, m.threads, m.repeats, 28e6 / (m.adam_gbps * 1e6));
  }
  return row;
}

std::string DramJson(const DramMeasurement& m) {
  std::string adam;
  if (m.adam_gbps > 0) {
    adam = absl::StrFormat(", \"adam_params\": %u, \"adam_isa\": \"%s\", \"adam_gbps\": %.4f",
                           m.adam_params, m.adam_isa, m.adam_gbps);
  }
  return absl::StrFormat(
      "\"dram\": {\"kernel\": \"triad\", \"bytes\": %u, \"threads\": %d, \"repeats\": %d, "
      "\"triad_gbps\": %.4f%s}",
      m.bytes, m.threads, m.repeats, m.gbps, adam);
}

}  // namespace tiermem
