// tiermem-probe --tune: finds the I/O block size, queue depth and thread count and the prefetch
// depth that run fastest on this machine, within a time budget, and writes them as an env file
// (TIERMEM_ENV_FILE) that the runtime reads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/config/config.h"
#include "tools/probe/io_sweep.h"

namespace tiermem {

struct TuneOptions {
  double budget_seconds = 60;
  uint64_t io_bytes = 256ull << 20;  // per I/O measurement
};

struct TuneResult {
  std::string engine;
  IoPoint io_default, io_tuned;   // final side-by-side check, medians of interleaved runs
  std::vector<IoPoint> io_tried;  // every point of the search, in order
  bool io_kept_default = false;   // the search found nothing better than the defaults
  // The search's pick when it lost the final check against the defaults (io_kept_default):
  // its settings and its figures in that check. Empty when it won, or was the defaults.
  std::optional<IoPoint> io_rejected;
  uint32_t depth_default = 0, depth_tuned = 0;
  uint32_t depth_rejected = 0;  // a depth that looked faster but lost the recheck; 0: none
  double compute_ms = 0;        // per forward layer of the step workload
  std::vector<std::pair<uint32_t, double>> depth_tried;  // depth, step seconds
  bool budget_exhausted = false;                         // a stage stopped early for the budget
  double seconds = 0;
};

using ProgressFn = std::function<void(const std::string&)>;

// Searches from `base` (the effective configuration): block size, then queue depth, then I/O
// threads, coordinate by coordinate, each measured on raw swap files in base's NVMe paths; then
// the prefetch depth on an emulated training step through the runtime with the I/O settings
// found. A candidate replaces the current value only when it is at least 3% faster (a prefetch
// depth must then be 3% faster again in two interleaved rechecks). Last, the
// tuned and the default I/O settings are measured interleaved; the defaults are kept unless the
// tuned ones are faster.
absl::StatusOr<TuneResult> Tune(const Config& base, const TuneOptions& options,
                                const ProgressFn& progress);

// The env file that will live at `path`: a comment header with what was measured, then one
// export line per setting.
std::string EnvFileText(const TuneResult& r, const Config& base, const std::string& path);

}  // namespace tiermem
