// The triad, as STREAM runs it: static slices per thread, first touch by the thread that uses
// the slice, best of several passes.
#include "tools/probe/probe_dram.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
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

std::string DramRow(const DramMeasurement& m) {
  return absl::StrFormat(
      "dram        triad       %8.2f GB/s   (3 arrays of %s, %d thread(s), best of %d)\n", m.gbps,
      HumanBytes(m.bytes), m.threads, m.repeats);
}

std::string DramJson(const DramMeasurement& m) {
  return absl::StrFormat(
      "\"dram\": {\"kernel\": \"triad\", \"bytes\": %u, \"threads\": %d, \"repeats\": %d, "
      "\"triad_gbps\": %.4f}",
      m.bytes, m.threads, m.repeats, m.gbps);
}

}  // namespace tiermem
