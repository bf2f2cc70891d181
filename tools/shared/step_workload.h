// An emulated training step through the runtime, shared by tiermem-probe --tune and step_bench:
// forward acquires each layer's parameters in HBM, "computes" for a set time, writes an
// activation and offloads it to DRAM; backward walks the layers in reverse, re-acquiring
// activations and parameters, computing twice as long. The first step teaches the runtime the
// schedule (tm_step_begin/end); the median of the others is the result.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "lib/runtime/runtime.h"

namespace tiermem {

struct StepWorkload {
  int layers = 12;
  uint64_t param_bytes = 16ull << 20;  // per layer; created with class PARAM, home by placement
  uint64_t act_bytes = 16ull << 20;    // per layer; class ACTIVATION
  double compute_ms = 3.4;             // forward, per layer; backward is twice that
  int steps = 6;                       // including the first (learning) step; at least 2
};

struct StepResult {
  double step_seconds = 0;         // median over the steps after the first
  double nvme_bytes_per_step = 0;  // read from NVMe in those steps
  double h2d_bytes_per_step = 0;   // DRAM -> HBM in those steps
  double d2h_bytes_per_step = 0;   // HBM -> DRAM in those steps
  tm_stats stats{};
};

// Creates the tensors, runs the steps, checks the activations came back, destroys the tensors.
absl::StatusOr<StepResult> RunSteps(Runtime& rt, const StepWorkload& w);

}  // namespace tiermem
