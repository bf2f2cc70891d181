// The extern "C" boundary, the planner: tm_plan and the names of its rungs. Needs no runtime.
#include <cstddef>
#include <cstring>

#include "lib/api/c_boundary.h"
#include "lib/plan/planner.h"

using namespace tiermem;  // NOLINT: the C entry points below implement the tm_* ABI

extern "C" {

TM_API tm_status tm_plan(const tm_plan_input* in, tm_plan_result* out) {
  if (in == nullptr) return NullArgument("tm_plan", "input");
  if (out == nullptr) return NullArgument("tm_plan", "out");
  // Callers built before the optimizer step and the combinations pass the smaller sizes, and
  // those built before the optimizer's state on NVMe the size up to backward_seconds.
  constexpr size_t kOldInput = offsetof(tm_plan_input, dram_bytes_per_s);
  constexpr size_t kOldResult =
      (offsetof(tm_plan_result, recommended_rungs) + alignof(double) - 1) / alignof(double) *
      alignof(double);  // padded after recommended
  constexpr size_t kCombinationsResult = offsetof(tm_plan_result, optimizer_state_bytes);
  const bool new_input = in->struct_size == sizeof(tm_plan_input);
  const bool nvme_result = out->struct_size == sizeof(tm_plan_result);
  const bool new_result = nvme_result || out->struct_size == kCombinationsResult;
  if ((!new_input && in->struct_size != kOldInput) ||
      (!new_result && out->struct_size != kOldResult)) {
    return Fail(
        TM_ERR_INVALID_ARGUMENT,
        "tm_plan: struct_size mismatch: fill with TM_PLAN_INPUT_INIT / TM_PLAN_RESULT_INIT");
  }
  PlanInput p;
  p.layers = in->layers;
  p.hidden = in->hidden;
  p.heads = in->heads;
  p.seq = in->seq;
  p.micro_batch = in->micro_batch;
  p.tensor_parallel = in->tensor_parallel;
  p.sequence_parallel = in->sequence_parallel != 0;
  p.flash_attention = in->flash_attention != 0;
  p.params = in->params;
  p.bytes_per_element = in->bytes_per_element;
  p.hbm_bytes = in->hbm_bytes;
  p.link_bytes_per_s = in->link_bytes_per_s;
  p.nvme_bytes_per_s = in->nvme_bytes_per_s;
  p.flops_per_s = in->flops_per_s;
  if (new_input) {
    p.dram_bytes_per_s = in->dram_bytes_per_s;
    p.optimizer_bytes_per_param = in->optimizer_bytes_per_param;
  }
  auto plan = MakePlan(p);
  if (!plan.ok()) return Fail(TM_ERR_INVALID_ARGUMENT, plan.status().message());
  out->activation_full = plan->activation_full;
  out->activation_selective = plan->activation_selective;
  out->activation_checkpoint = plan->activation_checkpoint;
  out->model_state = plan->model_state;
  out->forward_flops = plan->forward_flops;
  out->step_compute_seconds = plan->step_compute_seconds;
  for (int i = 0; i < kRungCount; ++i) {
    const RungResult& r = plan->rungs[i];
    out->rungs[i] = {r.hbm_bytes, r.added_seconds, r.fits ? 1 : 0, r.available ? 1 : 0};
  }
  out->recommended = plan->recommended;
  if (new_result) {
    const int best = plan->recommended_combination;
    out->recommended_rungs = best >= 0 ? plan->combinations[best].rungs : 0;
    out->recommended_hbm_bytes = best >= 0 ? plan->combinations[best].hbm_bytes : 0;
    out->recommended_added_seconds = best >= 0 ? plan->combinations[best].added_seconds : 0;
    out->optimizer_step_seconds = plan->optimizer_step_seconds;
    out->backward_seconds = plan->backward_seconds;
  }
  if (nvme_result) {
    out->optimizer_state_bytes = plan->optimizer_state_bytes;
    out->optimizer_nvme_seconds = plan->optimizer_nvme_seconds;
    out->optimizer_nvme_least_dram_bytes = plan->optimizer_nvme_least_dram;
    out->optimizer_nvme_full_speed_dram_bytes = plan->optimizer_nvme_full_speed_dram;
  }
  return TM_OK;
}

TM_API const char* tm_plan_rung_name(tm_plan_rung rung) {
  if (rung < 0 || rung >= TM_PLAN_RUNG_COUNT) return "unknown";
  return RungName(static_cast<Rung>(rung));
}

}  // extern "C"
