// tiermem-probe's measurements (docs/probe.md): HBM copies timed by the device's clock, the raw
// DRAM <-> NVMe sweep, the runtime's own paths, and the end-to-end offload demo.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "tools/probe/io_sweep.h"

namespace tiermem {

// One progress line on stderr: rewritten in place on a terminal, a line per step otherwise.
void Progress(const std::string& what);
// Clears the progress line on a terminal.
void ProgressDone();

// HBM <-> DRAM with pinned and with pageable host memory, and HBM <-> HBM.
struct CopyMeasurement {
  const char* from;
  const char* to;
  const char* host_memory;  // "pinned", "pageable" or "" (device to device)
  uint64_t bytes;
  int repeats;
  double gbps;  // 1e9 bytes per second, median of `repeats`
};
// Timed by the device's clock (CUDA events on a GPU), after warm-up copies until two agree
// within 10%; the buffers are outside the runtime's budgets.
absl::StatusOr<std::vector<CopyMeasurement>> Copies(Runtime& rt, uint64_t bytes, int repeats);

// The raw DRAM <-> NVMe sweep of one target: one path, or all paths striped.
struct SweepTarget {
  std::string name;  // the path, or "striped"
  std::vector<std::string> paths;
  std::string engine;
  uint64_t bytes = 0;
  std::vector<IoPoint> points;
};
struct SweepOptions {
  uint64_t bytes = 256ull << 20;
  std::vector<uint32_t> blocks = {128u << 10, 256u << 10, 1u << 20, 4u << 20};
  std::vector<uint32_t> depths = {1, 4, 16, 32, 64};
  bool full_per_path = false;  // the whole grid on each path alone, however many there are
};
// Up to this many paths, each path alone gets the whole grid by default.
inline constexpr size_t kFullGridPaths = 2;
// Each path alone when there are several (above kFullGridPaths paths: only at the configured
// block size, unless full_per_path), then all of them striped with the whole grid (the last
// target); block sizes below a path's O_DIRECT alignment are left out.
absl::StatusOr<std::vector<SweepTarget>> Sweep(const Config& c, const SweepOptions& o);
// The point moving the most bytes per second over both directions; nullptr when none ran.
const IoPoint* Best(const SweepTarget& t);

// A tensor moved through the runtime's own offload and acquire.
struct Measurement {
  const char* from;
  const char* to;
  uint64_t bytes;
  double gbps;  // 1e9 bytes per second, median of 3
};
// DRAM <-> NVMe and DRAM <-> HBM with the configured engine, block size and queue depth.
absl::StatusOr<std::vector<Measurement>> Bench(Runtime& rt, uint64_t bytes);

struct DemoResult {
  int tensors = 0, offloads = 0, verified = 0;
  uint64_t tensor_bytes = 0, hbm_budget = 0;
  double seconds = 0;
  tm_stats stats{};
};
// Tensors worth 1.5x a 256 MiB HBM budget: written into HBM and offloaded to NVMe, brought back
// one by one and checked byte for byte, in a runtime of its own.
absl::StatusOr<DemoResult> Demo();

}  // namespace tiermem
