// The planner's arithmetic. Notation as in the paper: s sequence, b micro-batch, h hidden, a
// heads, L layers, t tensor-parallel degree. The paper's per-layer coefficients are already in
// bytes for 16-bit activations: they are scaled by bytes_per_element / 2, never multiplied by 2.
#include "lib/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/plan/plan_ladder.h"

namespace tiermem {
namespace {

// The least bandwidth priced (1 MB/s): below it a step's seconds run to hundreds of digits.
constexpr double kLeastBandwidth = 1e6;

absl::Status Need(bool ok, const char* field, double value, const char* why) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s=%g: %s", field, value, why));
}

}  // namespace

const char* RungName(Rung r) {
  static constexpr const char* kNames[] = {
      "keep all activations",    "selective recompute",        "per-layer recompute",
      "optimizer-state offload", "activation offload to DRAM", "activation offload to NVMe",
      "parameter offload (NVMe)"};
  return kNames[static_cast<int>(r)];
}

namespace {

// InvalidArgument naming every input that is missing, out of range, not finite, or not whole
// where a count must be ("field=value: why", joined by "; "); then the layout's rules.
absl::Status CheckInput(const PlanInput& in) {
  std::vector<std::string> bad;
  auto note = [&](const absl::Status& st) {
    if (!st.ok()) bad.emplace_back(st.message());
  };
  for (auto [ok, field, v, why] :
       {std::tuple{in.layers >= 1, "layers", in.layers, "at least 1"},
        std::tuple{in.hidden >= 1, "hidden", in.hidden, "at least 1"},
        std::tuple{in.heads >= 1, "heads", in.heads, "at least 1"},
        std::tuple{in.seq >= 1, "seq", in.seq, "at least 1"},
        std::tuple{in.micro_batch >= 1, "micro_batch", in.micro_batch, "at least 1"},
        std::tuple{in.tensor_parallel >= 1, "tensor_parallel", in.tensor_parallel, "at least 1"},
        std::tuple{in.params > 0, "params", in.params, "must be positive"},
        std::tuple{in.bytes_per_element > 0, "bytes_per_element", in.bytes_per_element,
                   "must be positive"},
        std::tuple{in.hbm_bytes > 0, "hbm_bytes", in.hbm_bytes, "must be positive"},
        std::tuple{in.link_bytes_per_s >= kLeastBandwidth, "link_bytes_per_s", in.link_bytes_per_s,
                   "must be at least 1 MB/s (0.001 GB/s)"},
        std::tuple{in.nvme_bytes_per_s == 0 || in.nvme_bytes_per_s >= kLeastBandwidth,
                   "nvme_bytes_per_s", in.nvme_bytes_per_s,
                   "must be at least 1 MB/s (0.001 GB/s), or 0: no NVMe"},
        std::tuple{in.flops_per_s >= 1e9, "flops_per_s", in.flops_per_s,
                   "must be at least 1 GFLOP/s (0.001 TFLOP/s)"},
        std::tuple{in.dram_bytes_per_s == 0 || in.dram_bytes_per_s >= kLeastBandwidth,
                   "dram_bytes_per_s", in.dram_bytes_per_s,
                   "must be at least 1 MB/s (0.001 GB/s), or 0: the CPU step not priced"},
        std::tuple{in.optimizer_bytes_per_param > 0, "optimizer_bytes_per_param",
                   in.optimizer_bytes_per_param, "must be positive"}}) {
    note(Need(std::isfinite(v), field, v, "must be finite"));
    if (std::isfinite(v)) note(Need(ok, field, v, why));
  }
  // Counts are whole: a layer, a head or a token is not split. The layout is Megatron's: heads
  // divide the hidden size, and tensor parallelism splits whole heads.
  for (auto [field, v] : {std::pair{"layers", in.layers}, std::pair{"hidden", in.hidden},
                          std::pair{"heads", in.heads}, std::pair{"seq", in.seq},
                          std::pair{"micro_batch", in.micro_batch},
                          std::pair{"tensor_parallel", in.tensor_parallel}}) {
    if (std::isfinite(v) && v >= 1)
      note(Need(v == std::floor(v), field, v, "must be a whole number"));
  }
  // The layout's rules, between counts that are each valid (whole, at least 1).
  auto count = [](double v) { return std::isfinite(v) && v >= 1 && v == std::floor(v); };
  if (count(in.hidden) && count(in.heads) && std::fmod(in.hidden, in.heads) != 0) {
    bad.push_back(absl::StrFormat(
        "hidden=%g is not a multiple of heads=%g: each head has hidden/heads dimensions", in.hidden,
        in.heads));
  }
  if (count(in.heads) && count(in.tensor_parallel) &&
      std::fmod(in.heads, in.tensor_parallel) != 0) {
    bad.push_back(
        absl::StrFormat("heads=%g is not a multiple of tensor_parallel=%g: tensor parallelism "
                        "splits whole heads",
                        in.heads, in.tensor_parallel));
  }
  if (!bad.empty()) return absl::InvalidArgumentError(absl::StrJoin(bad, "; "));
  return absl::OkStatus();
}

// The CPU step with its state on NVMe. The least DRAM: a slice of the smallest tiermem.torch
// chooses (4 KiB, the NVMe tier's block) and its new version, an 8 KiB tier, where
// tests/python/test_optimizer_budgets.py trains reading the state once a step. The disk's speed:
// the reads ahead (a quarter of the window, which is half the tier) hold about 1 ms of the disk's
// bandwidth, so that a slice's read outlasts the per-slice costs; bench/optim_nvme_bound.py
// measured 1.02x the disk bound with a 12 MiB tier on a 2.3 GB/s disk. Not below 16 MiB, nor above
// the state.
void PriceNvmeOptimizer(const PlanInput& in, double params_per_gpu, Plan* p) {
  p->optimizer_state_bytes = 12 * params_per_gpu;
  p->optimizer_nvme_least_dram = 8 << 10;
  if (in.nvme_bytes_per_s > 0) {
    p->optimizer_nvme_seconds = 2 * p->optimizer_state_bytes / in.nvme_bytes_per_s;
    // Never more than the state: a tier that holds it keeps it there between steps.
    p->optimizer_nvme_full_speed_dram = std::min(
        p->optimizer_state_bytes, std::max(16.0 * (1 << 20), 8 * in.nvme_bytes_per_s * 1e-3));
  }
}

// Finite inputs can still overflow a double (layers=1e308): a plan of infinities would
// recommend a rung at "0 added seconds".
absl::Status CheckFinite(const Plan& p) {
  for (auto [what, v] :
       {std::pair{"activation bytes per layer", p.activation_full},
        std::pair{"model state bytes", p.model_state}, std::pair{"forward FLOPs", p.forward_flops},
        std::pair{"step compute seconds", p.step_compute_seconds},
        std::pair{"optimizer step seconds", p.optimizer_step_seconds}}) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the inputs give %s = %g: too large to price (check layers, hidden, heads, seq, "
          "micro_batch, params and optimizer_bytes_per_param)",
          what, v));
    }
  }
  for (const PlanPrice& c : p.combinations) {
    if (!std::isfinite(c.hbm_bytes) || !std::isfinite(c.added_seconds)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the inputs give hbm_bytes = %g, added_seconds = %g for %s: too large to price",
          c.hbm_bytes, c.added_seconds, RungSetName(c.rungs)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const PlanInput& in) {
  if (absl::Status st = CheckInput(in); !st.ok()) return st;
  const double s = in.seq, b = in.micro_batch, h = in.hidden, a = in.heads, L = in.layers;
  const double t = in.tensor_parallel;
  const double scale = in.bytes_per_element / 2;
  const double sbh = s * b * h;
  const double attention = 5 * a * s / h;  // the stored attention scores and softmax, per sbh

  Plan p;
  // Korthikanti et al. 2022, Table 2 and section 4.
  if (in.sequence_parallel) {
    p.activation_full = sbh / t * (34 + (in.flash_attention ? 0 : attention)) * scale;
    p.activation_selective = sbh / t * 34 * scale;
    p.activation_checkpoint = 2 * sbh / t * scale;
  } else {
    p.activation_full = sbh * (10 + 24 / t + (in.flash_attention ? 0 : attention / t)) * scale;
    p.activation_selective = sbh * (10 + 24 / t) * scale;
    p.activation_checkpoint = 2 * sbh * scale;
  }
  const double params_per_gpu = in.params / t;
  p.model_state = 16 * params_per_gpu;  // 2 fp16 weights + 2 fp16 grads + 12 fp32 Adam state
  // Megatron-LM's count: forward = 24 b s L h^2 (1 + s / 6h) FLOPs, split over t.
  p.forward_flops = 24 * b * s * L * h * h * (1 + s / (6 * h)) / t;
  p.step_compute_seconds = 3 * p.forward_flops / in.flops_per_s;
  p.backward_seconds = 2 * p.forward_flops / in.flops_per_s;
  // ZeRO-Offload: the fp32 state stays in DRAM and the CPU steps it there; fp16 grads (2 B/param)
  // go down and fp16 params (2 B/param) come up.
  p.optimizer_link_bytes = 2 * (2 * params_per_gpu);
  if (in.dram_bytes_per_s > 0) {
    p.optimizer_step_seconds = in.optimizer_bytes_per_param * params_per_gpu / in.dram_bytes_per_s;
  }
  PriceNvmeOptimizer(in, params_per_gpu, &p);
  PriceLadder(in, &p);
  if (absl::Status st = CheckFinite(p); !st.ok()) return st;
  return p;
}

}  // namespace tiermem
