// The planner's arithmetic. Notation as in the paper: s sequence, b micro-batch, h hidden, a
// heads, L layers, t tensor-parallel degree. The paper's per-layer coefficients are already in
// bytes for 16-bit activations: they are scaled by bytes_per_element / 2, never multiplied by 2.
#include "lib/plan/planner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tiermem {
namespace {

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

absl::StatusOr<Plan> MakePlan(const PlanInput& in) {
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
        std::tuple{in.link_bytes_per_s > 0, "link_bytes_per_s", in.link_bytes_per_s,
                   "must be positive"},
        std::tuple{in.nvme_bytes_per_s >= 0, "nvme_bytes_per_s", in.nvme_bytes_per_s,
                   "must not be negative"},
        std::tuple{in.flops_per_s > 0, "flops_per_s", in.flops_per_s, "must be positive"}}) {
    if (auto st = Need(ok && std::isfinite(v), field, v, why); !st.ok()) return st;
  }
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
  // Recomputing the attention core: QK^T and scores x V, 2 b s^2 h FLOPs each, per layer.
  const double attention_flops = in.flash_attention ? 0 : 4 * b * s * s * h * L / t;

  const double compute = p.step_compute_seconds;
  auto hidden_under_compute = [&](double transfer) { return std::max(0.0, transfer - compute); };
  const double weights_grads = 4 * params_per_gpu;  // fp16 weights and grads stay on the GPU
  const double working_layers = 2;  // activations a layer's backward and the next prefetch hold
  auto& r = p.rungs;
  r[0] = {Rung::kKeepAll, p.model_state + L * p.activation_full, 0};
  r[1] = {Rung::kSelectiveRecompute, p.model_state + L * p.activation_selective,
          attention_flops / in.flops_per_s};
  r[2] = {Rung::kFullRecompute,
          p.model_state + L * p.activation_checkpoint + p.activation_selective,
          p.forward_flops / in.flops_per_s};
  // ZeRO-Offload: fp32 state stays in DRAM; fp16 grads go down and fp16 weights come up.
  const double opt_transfer = 2 * (2 * params_per_gpu) / in.link_bytes_per_s;
  r[3] = {Rung::kOptimizerOffload, weights_grads + L * p.activation_selective,
          r[1].added_seconds + hidden_under_compute(opt_transfer)};
  // Activations leave HBM after their layer's forward and come back for its backward.
  const double act_bytes = L * p.activation_selective;
  const double act_transfer = 2 * act_bytes / in.link_bytes_per_s;
  r[4] = {Rung::kActivationOffloadDram, weights_grads + working_layers * p.activation_selective,
          r[1].added_seconds + hidden_under_compute(opt_transfer + act_transfer)};
  const bool nvme = in.nvme_bytes_per_s > 0;
  const double nvme_bw = nvme ? std::min(in.nvme_bytes_per_s, in.link_bytes_per_s) : 1;
  r[5] = {Rung::kActivationOffloadNvme, r[4].hbm_bytes,
          r[1].added_seconds +
              hidden_under_compute(std::max(opt_transfer + act_transfer, 2 * act_bytes / nvme_bw))};
  // ZeRO-Infinity: weights come up for forward and again for backward, grads go down, all from
  // and to NVMe; HBM holds a couple of layers of weights.
  const double param_bytes = 2 * params_per_gpu;
  const double param_transfer = (2 * param_bytes + param_bytes) / nvme_bw;
  r[6] = {Rung::kParameterOffload,
          working_layers * (4 * params_per_gpu / L) + working_layers * p.activation_selective,
          r[1].added_seconds + hidden_under_compute(param_transfer + act_transfer)};
  r[5].available = r[6].available = nvme;
  for (auto& x : r) x.fits = x.available && x.hbm_bytes <= in.hbm_bytes;
  // The cheapest rung that fits; on a tie, the earlier rung of the ladder.
  for (int i = 0; i < kRungCount; ++i) {
    if (!r[i].fits) continue;
    if (p.recommended < 0 || r[i].added_seconds < r[p.recommended].added_seconds) p.recommended = i;
  }
  return p;
}

}  // namespace tiermem
