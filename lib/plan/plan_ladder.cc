// The ladder's combinations priced part by part. Notation as in lib/planner.cc; P is the
// parameter count per GPU (params / t). See docs/planner.md for the formulas in prose.
#include "lib/plan/plan_ladder.h"

#include <algorithm>
#include <bit>

namespace tiermem {
namespace {

constexpr RungSet kSelective = RungBit(Rung::kSelectiveRecompute);
constexpr RungSet kPerLayer = RungBit(Rung::kFullRecompute);
constexpr RungSet kOptimizer = RungBit(Rung::kOptimizerOffload);
constexpr RungSet kActDram = RungBit(Rung::kActivationOffloadDram);
constexpr RungSet kActNvme = RungBit(Rung::kActivationOffloadNvme);
constexpr RungSet kParams = RungBit(Rung::kParameterOffload);
constexpr RungSet kAllRungs = (RungSet{1} << kRungCount) - 1;

// Layers of activations (and, under parameter offload, of weights) HBM holds when the rest is
// offloaded: the one whose backward runs and the next one prefetched.
constexpr double kWorkingLayers = 2;

bool Has(RungSet set, RungSet bits) { return (set & bits) == bits; }

// The ladder: each rung with every rung before it.
constexpr RungSet kLadder[kRungCount] = {
    0,
    kSelective,
    kSelective | kPerLayer,
    kSelective | kPerLayer | kOptimizer,
    kSelective | kPerLayer | kOptimizer | kActDram,
    kSelective | kPerLayer | kOptimizer | kActNvme,
    kSelective | kPerLayer | kOptimizer | kActDram | kParams,
};

// Least added time; on a tie, fewer rungs, then the lower set.
bool Cheaper(const PlanPrice& a, const PlanPrice& b) {
  if (a.added_seconds != b.added_seconds) return a.added_seconds < b.added_seconds;
  const int na = std::popcount(a.rungs), nb = std::popcount(b.rungs);
  if (na != nb) return na < nb;
  return a.rungs < b.rungs;
}

}  // namespace

bool ValidRungSet(RungSet set) {
  if ((set & ~kAllRungs) != 0 || (set & RungBit(Rung::kKeepAll)) != 0) return false;
  if (Has(set, kPerLayer) && !Has(set, kSelective)) return false;
  if (Has(set, kActDram | kActNvme)) return false;
  if (Has(set, kParams) && !Has(set, kOptimizer)) return false;
  return true;
}

PlanPrice PriceRungSet(const PlanInput& in, const Plan& f, RungSet set) {
  PlanPrice r;
  r.rungs = set;
  const double L = in.layers;
  const double P = in.params / in.tensor_parallel;
  const bool selective = Has(set, kSelective), per_layer = Has(set, kPerLayer);
  const bool optimizer = Has(set, kOptimizer), params = Has(set, kParams);
  const bool act_dram = Has(set, kActDram), act_nvme = Has(set, kActNvme);
  const bool act_offload = act_dram || act_nvme;
  const double working_layers = std::min(kWorkingLayers, L);

  // Recompute: what each layer keeps from its forward to its backward, and the FLOPs done again.
  // Per-layer recompute keeps the layer's input; the layer being recomputed holds its selective
  // activations during its backward, so its attention core is recomputed once more.
  const double stored = per_layer   ? f.activation_checkpoint
                        : selective ? f.activation_selective
                                    : f.activation_full;
  const double working = per_layer ? f.activation_selective : 0;
  const double attention_flops = in.flash_attention ? 0
                                                    : 4 * in.micro_batch * in.seq * in.seq *
                                                          in.hidden * L / in.tensor_parallel;
  const double recompute_flops =
      (selective ? attention_flops : 0) + (per_layer ? f.forward_flops : 0);
  r.recompute_seconds = recompute_flops / in.flops_per_s;

  // HBM: 16 B/param of mixed-precision Adam state; 4 B/param (fp16 weights and grads) once the
  // fp32 state lives in DRAM; the working layers' weights and grads once the weights live on NVMe.
  r.state_bytes = params ? working_layers * 4 * P / L : optimizer ? 4 * P : f.model_state;
  r.activation_bytes = (act_offload ? working_layers : L) * stored + working;
  r.hbm_bytes = r.state_bytes + r.activation_bytes;

  // Traffic per step, both directions summed against one direction's bandwidth.
  // ZeRO-Offload: fp16 grads go down (2 B/param), fp16 params come up (2 B/param).
  // ZeRO-Infinity: fp16 weights come up from NVMe for forward and again for backward, grads go
  // down to the DRAM-resident optimizer, updated fp16 weights go back to NVMe.
  // Offloaded activations go down after their layer's forward and come up for its backward.
  if (optimizer && !params) r.link_bytes += f.optimizer_link_bytes;
  if (params) {
    r.link_bytes += 3 * 2 * P;
    r.nvme_bytes += 3 * 2 * P;
  }
  if (act_offload) r.link_bytes += 2 * L * stored;
  if (act_nvme) r.nvme_bytes += 2 * L * stored;
  // The link and the drives are separate channels working at once: the slower one bounds.
  const double link_s = r.link_bytes / in.link_bytes_per_s;
  const double nvme_s =
      r.nvme_bytes > 0 && in.nvme_bytes_per_s > 0 ? r.nvme_bytes / in.nvme_bytes_per_s : 0;
  r.transfer_seconds = std::max(link_s, nvme_s);
  const double compute = f.step_compute_seconds + r.recompute_seconds;
  r.transfer_exposed_seconds = std::max(0.0, r.transfer_seconds - compute);

  // The CPU optimizer step runs bucket by bucket as gradients land: backward (recompute
  // included) hides it when it lasts at least as long; otherwise the difference is added.
  r.backward_seconds = f.backward_seconds + r.recompute_seconds;
  if (optimizer) {
    r.optimizer_step_seconds = f.optimizer_step_seconds;
    r.optimizer_exposed_seconds = std::max(0.0, r.optimizer_step_seconds - r.backward_seconds);
  }
  r.added_seconds = r.recompute_seconds + r.transfer_exposed_seconds + r.optimizer_exposed_seconds;

  r.available =
      (!(act_nvme || params) || in.nvme_bytes_per_s > 0) && (!optimizer || in.dram_bytes_per_s > 0);
  r.fits = r.available && r.hbm_bytes <= in.hbm_bytes;
  return r;
}

void PriceLadder(const PlanInput& in, Plan* p) {
  p->combinations.clear();
  p->recommended_combination = -1;
  p->recommended = -1;
  for (RungSet set = 0; set <= kAllRungs; ++set) {
    if (!ValidRungSet(set)) continue;
    p->combinations.push_back(PriceRungSet(in, *p, set));
    const PlanPrice& c = p->combinations.back();
    const int i = static_cast<int>(p->combinations.size()) - 1;
    if (c.fits && (p->recommended_combination < 0 ||
                   Cheaper(c, p->combinations[p->recommended_combination]))) {
      p->recommended_combination = i;
    }
  }
  for (int i = 0; i < kRungCount; ++i) {
    const PlanPrice c = PriceRungSet(in, *p, kLadder[i]);
    p->rungs[i] = {static_cast<Rung>(i), c.hbm_bytes, c.added_seconds, c.fits,
                   c.available,          kLadder[i]};
  }
  if (p->recommended_combination >= 0) {
    const RungSet best = p->combinations[p->recommended_combination].rungs;
    p->recommended = best == 0 ? 0 : std::bit_width(best) - 1;
  }
}

std::string RungSetName(RungSet set) {
  if (set == 0) return RungName(Rung::kKeepAll);
  std::string name;
  for (int i = 1; i < kRungCount; ++i) {
    const RungSet bit = RungBit(static_cast<Rung>(i));
    if (!Has(set, bit)) continue;
    if (bit == kSelective && Has(set, kPerLayer)) continue;
    if (!name.empty()) name += " + ";
    name += RungName(static_cast<Rung>(i));
  }
  return name;
}

}  // namespace tiermem
