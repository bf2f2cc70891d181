#include "tools/shared/step_workload.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

#define STEP_RETURN_IF_ERROR(expr) \
  do {                             \
    absl::Status s_ = (expr);      \
    if (!s_.ok()) return s_;       \
  } while (0)

absl::Status Steps(Runtime& rt, const StepWorkload& w, const std::vector<uint64_t>& params,
                   const std::vector<uint64_t>& acts, std::vector<double>& times,
                   tm_stats& after_first) {
  const auto fwd = std::chrono::duration<double, std::milli>(w.compute_ms);
  const auto bwd = 2 * fwd;
  for (int step = 0; step < w.steps; ++step) {
    if (step == 1) after_first = rt.Stats();
    STEP_RETURN_IF_ERROR(rt.StepBegin());
    auto t0 = Clock::now();
    for (int l = 0; l < w.layers; ++l) {
      auto p = rt.Acquire(params[l], TM_TIER_HBM, TM_ACCESS_READ, nullptr);
      if (!p.ok()) return p.status();
      std::this_thread::sleep_for(fwd);
      auto a = rt.Acquire(acts[l], TM_TIER_HBM, TM_ACCESS_WRITE, nullptr);
      if (!a.ok()) return a.status();
      static_cast<char*>(*a)[0] = static_cast<char>(step);  // the forward's output
      STEP_RETURN_IF_ERROR(rt.Release(acts[l], TM_TIER_HBM));
      STEP_RETURN_IF_ERROR(rt.Offload(acts[l], TM_TIER_DRAM));
      STEP_RETURN_IF_ERROR(rt.Release(params[l], TM_TIER_HBM));
    }
    for (int l = w.layers - 1; l >= 0; --l) {
      auto a = rt.Acquire(acts[l], TM_TIER_HBM, TM_ACCESS_READ, nullptr);
      if (!a.ok()) return a.status();
      auto p = rt.Acquire(params[l], TM_TIER_HBM, TM_ACCESS_READ, nullptr);
      if (!p.ok()) return p.status();
      if (static_cast<char*>(*a)[0] != static_cast<char>(step)) {
        return absl::InternalError("an activation came back with the wrong bytes");
      }
      std::this_thread::sleep_for(bwd);
      STEP_RETURN_IF_ERROR(rt.Release(params[l], TM_TIER_HBM));
      STEP_RETURN_IF_ERROR(rt.Release(acts[l], TM_TIER_HBM));
    }
    STEP_RETURN_IF_ERROR(rt.StepEnd());
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return rt.SyncAll();
}

}  // namespace

absl::StatusOr<StepResult> RunSteps(Runtime& rt, const StepWorkload& w) {
  if (w.layers < 1 || w.steps < 2) return absl::InvalidArgumentError("need a layer and 2 steps");
  std::vector<uint64_t> params, acts;
  absl::Status st;
  std::vector<char> init(w.param_bytes, 7);
  // Creates a tensor into `into`; on failure records the status.
  auto create = [&](uint64_t bytes, tm_tensor_class cls, const std::string& name,
                    std::vector<uint64_t>& into) {
    auto h = rt.CreateTensor({bytes, cls, TM_TIER_BY_PLACEMENT, name});
    if (!h.ok()) {
      st = h.status();
      return false;
    }
    into.push_back(*h);
    return true;
  };
  for (int l = 0; l < w.layers && st.ok(); ++l) {
    if (!create(w.param_bytes, TM_CLASS_PARAM, "param" + std::to_string(l), params) ||
        !create(w.act_bytes, TM_CLASS_ACTIVATION, "act" + std::to_string(l), acts)) {
      break;
    }
    st = rt.Write(params.back(), 0, init.data(), w.param_bytes);  // lands in its home tier
  }
  std::vector<double> times;
  tm_stats first{};
  if (st.ok()) st = Steps(rt, w, params, acts, times, first);
  StepResult r;
  if (st.ok()) {
    std::vector<double> measured(times.begin() + 1, times.end());
    std::sort(measured.begin(), measured.end());
    r.step_seconds = measured[measured.size() / 2];
    r.stats = rt.Stats();
    auto per_step = [&](int from, int to) {
      return static_cast<double>(r.stats.bytes_moved[from][to] - first.bytes_moved[from][to]) /
             (w.steps - 1);
    };
    r.nvme_bytes_per_step = per_step(TM_TIER_NVME, TM_TIER_DRAM);
    r.h2d_bytes_per_step = per_step(TM_TIER_DRAM, TM_TIER_HBM);
    r.d2h_bytes_per_step = per_step(TM_TIER_HBM, TM_TIER_DRAM);
  }
  (void)rt.SyncAll();
  for (uint64_t h : params) (void)rt.DestroyTensor(h);
  for (uint64_t h : acts) (void)rt.DestroyTensor(h);
  if (!st.ok()) return st;
  return r;
}

}  // namespace tiermem
