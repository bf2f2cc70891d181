// The activation-memory / recompute / offload cost model: for a model shape, an HBM budget and
// measured bandwidths, what each combination of the ladder's rungs needs in HBM and adds to a
// step (the CPU optimizer step included), and which combination to use. Activation memory after
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
// arXiv 2205.05198); every quantity in bytes, seconds and FLOP/s. The combinations are priced in
// lib/plan_ladder.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

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
  // The CPU optimizer step once the state lives in DRAM: a fused Adam pass reads and writes
  // about 28 B per parameter (fp32 p, m, v read and written, the gradient read), bound by DRAM.
  double dram_bytes_per_s = 0;  // the CPU Adam step's host bandwidth (probe dram.adam_gbps); 0: n/a
  double optimizer_bytes_per_param = 28;  // DRAM traffic of the CPU step per parameter
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

// A combination of rungs, one bit per Rung (kKeepAll is the empty set).
using RungSet = uint32_t;
constexpr RungSet RungBit(Rung r) { return RungSet{1} << static_cast<int>(r); }

// What one combination of rungs needs and adds. Each total is the sum of its parts.
struct PlanPrice {
  RungSet rungs = 0;
  // HBM per GPU = state_bytes + activation_bytes.
  double hbm_bytes = 0;
  double state_bytes = 0;       // weights, gradients and optimizer state left in HBM
  double activation_bytes = 0;  // activations held in HBM, the working layers included
  // Added seconds per step, over keep-all = recompute + transfer_exposed + optimizer_exposed.
  double added_seconds = 0;
  double recompute_seconds = 0;           // the FLOPs done again, at the achieved throughput
  double transfer_seconds = 0;            // link and NVMe traffic (the slower of the two channels)
  double transfer_exposed_seconds = 0;    // what the step's compute (recompute included) leaves
  double optimizer_step_seconds = 0;      // the CPU step (0 unless the state is offloaded)
  double backward_seconds = 0;            // backward, recompute included: what can hide the step
  double optimizer_exposed_seconds = 0;   // max(0, CPU step - backward)
  double link_bytes = 0, nvme_bytes = 0;  // moved per step, both directions
  bool fits = false;
  bool available = true;  // false: a bandwidth it needs (NVMe, DRAM) was not given
};

// One rung of the ladder, priced with every rung before it applied.
struct RungResult {
  Rung rung;
  double hbm_bytes = 0;      // needed per GPU
  double added_seconds = 0;  // per step, over keep-all
  bool fits = false;
  bool available = true;  // false: a bandwidth it needs was not given
  RungSet rungs = 0;      // the rungs applied: this one and those before it
};

struct Plan {
  // Per layer, per GPU, bytes.
  double activation_full = 0;         // no recomputation
  double activation_selective = 0;    // attention core recomputed (or FlashAttention)
  double activation_checkpoint = 0;   // full recomputation: the layer's input only
  double model_state = 0;             // 16 bytes per parameter (mixed-precision Adam), per GPU
  double forward_flops = 0;           // per step, per GPU
  double step_compute_seconds = 0;    // forward + backward (3x forward)
  double backward_seconds = 0;        // backward alone (2x forward), before any recompute
  double optimizer_step_seconds = 0;  // the CPU step over DRAM; 0 without a DRAM bandwidth
  double optimizer_link_bytes = 0;    // ZeRO-Offload's per step: fp16 grads down, fp16 params up
  // The CPU step with its fp32 state (master and moments, 12 B/param) on NVMe, streamed through
  // DRAM in slices of a sixteenth of the DRAM tier (CPUAdam(state_tier="nvme")):
  double optimizer_state_bytes = 0;           // per GPU
  double optimizer_nvme_seconds = 0;          // read and written once; 0 without an NVMe bandwidth
  double optimizer_nvme_least_dram = 0;       // the least DRAM tier it runs in
  double optimizer_nvme_full_speed_dram = 0;  // the DRAM tier for the disk's speed; 0 without NVMe
  // The ladder, cumulative: rung i priced on top of the rungs before it (the NVMe rung instead of
  // the DRAM one, parameter offload with activations in DRAM).
  std::array<RungResult, kRungCount> rungs{};
  // Every valid combination of rungs (ValidRungSet), in ascending RungSet order.
  std::vector<PlanPrice> combinations;
  int recommended_combination = -1;  // index into combinations, -1 when nothing fits
  int recommended = -1;  // the highest rung of the recommended combination, -1 when none fits
};

// InvalidArgument naming the field when an input is missing or out of range.
absl::StatusOr<Plan> MakePlan(const PlanInput& in);
const char* RungName(Rung r);

}  // namespace tiermem
