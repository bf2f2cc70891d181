// The activation-memory / recompute / offload cost model: for a model shape, an HBM budget and
// measured bandwidths, what each rung of the ladder needs in HBM and adds to a step, and which
// rung to stand on. Activation memory after Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", arXiv 2205.05198); every quantity in bytes,
// seconds and FLOP/s.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tiermem {

struct PlanInput {
  // Model shape.
  double layers = 0, hidden = 0, heads = 0, seq = 0, micro_batch = 0;
  double tensor_parallel = 1;
  bool sequence_parallel = false;
  bool flash_attention = false;  // attention scores never stored: no 5as/h term
  double params = 0;             // parameter count of the whole model
  double bytes_per_element = 2;  // activation element size (the paper's coefficients are for 2)
  // Machine.
  double hbm_bytes = 0;         // per GPU
  double link_bytes_per_s = 0;  // HBM <-> DRAM, per direction
  double nvme_bytes_per_s = 0;  // DRAM <-> NVMe (0: no NVMe rungs)
  double flops_per_s = 0;       // achieved compute throughput per GPU
};

enum class Rung {
  kKeepAll,
  kSelectiveRecompute,
  kFullRecompute,
  kOptimizerOffload,
  kActivationOffloadDram,
  kActivationOffloadNvme,
  kParameterOffload,
  kCount
};
constexpr int kRungCount = static_cast<int>(Rung::kCount);

struct RungResult {
  Rung rung;
  double hbm_bytes = 0;      // needed per GPU
  double added_seconds = 0;  // per step, over keep-all
  bool fits = false;
  bool available = true;  // false: needs NVMe and none was given
};

struct Plan {
  // Per layer, per GPU, bytes.
  double activation_full = 0;        // no recomputation
  double activation_selective = 0;   // attention core recomputed (or FlashAttention)
  double activation_checkpoint = 0;  // full recomputation: the layer's input only
  double model_state = 0;            // 16 bytes per parameter (mixed-precision Adam), per GPU
  double forward_flops = 0;          // per step, per GPU
  double step_compute_seconds = 0;   // forward + backward (3x forward)
  std::array<RungResult, kRungCount> rungs{};
  int recommended = -1;  // index into rungs, -1 when nothing fits
};

// InvalidArgument naming the field when an input is missing or out of range.
absl::StatusOr<Plan> MakePlan(const PlanInput& in);
const char* RungName(Rung r);

}  // namespace tiermem
