// The planner against hand-computed cases (Korthikanti et al. 2022 formulas, units carried
// through), with tensor and sequence parallelism, and budgets that force each combination of
// rungs. The cumulative ladder and the combinations (lib/plan/plan_ladder.h) are checked part by
// part and against a brute force of this file's own over every set of rungs (plan_ladder_test.cc).
#include "lib/plan/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>

#include "lib/plan/plan_ladder.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

constexpr double kGiB = 1ull << 30;

// 7B: h=4096, a=32, L=32, s=4096, b=8; 400 TFLOP/s, PCIe 25 GB/s, NVMe 6 GB/s.
PlanInput SevenB(double hbm_gib) {
  PlanInput in;
  in.layers = 32;
  in.hidden = 4096;
  in.heads = 32;
  in.seq = 4096;
  in.micro_batch = 8;
  in.params = 7e9;
  in.hbm_bytes = hbm_gib * kGiB;
  in.link_bytes_per_s = 25e9;
  in.nvme_bytes_per_s = 6e9;
  in.flops_per_s = 400e12;
  in.dram_bytes_per_s = 100e9;
  return in;
}

RungSet Set(std::initializer_list<Rung> rungs) {
  RungSet s = 0;
  for (Rung r : rungs) s |= RungBit(r);
  return s;
}

TEST(Planner, ActivationFormulas) {
  auto p = MakePlan(SevenB(80));
  ASSERT_TRUE(p.ok()) << p.status();
  // sbh = 4096 * 8 * 4096 = 134217728; 5as/h = 160.
  EXPECT_DOUBLE_EQ(p->activation_full, 134217728.0 * 194);  // 24.25 GiB per layer
  EXPECT_DOUBLE_EQ(p->activation_full / kGiB, 24.25);
  EXPECT_DOUBLE_EQ(p->activation_selective, 134217728.0 * 34);  // 4.25 GiB
  EXPECT_DOUBLE_EQ(p->activation_checkpoint, 134217728.0 * 2);  // 256 MiB
  EXPECT_DOUBLE_EQ(p->model_state, 112e9);                      // 16 B x 7e9
  // 24 b s L h^2 (1 + s/6h) = 24*8*4096*32*4096^2*(7/6)
  EXPECT_NEAR(p->forward_flops, 4.925812e14, 1e8);
  EXPECT_NEAR(p->step_compute_seconds, 3.694359, 1e-5);
}

TEST(Planner, TensorAndSequenceParallel) {
  PlanInput in = SevenB(80);
  in.tensor_parallel = 8;
  auto tp = MakePlan(in);
  ASSERT_TRUE(tp.ok());
  EXPECT_DOUBLE_EQ(tp->activation_full, 134217728.0 * (10 + 3 + 20));  // sbh(10 + 24/t + 5as/ht)
  EXPECT_DOUBLE_EQ(tp->activation_selective, 134217728.0 * 13);
  EXPECT_DOUBLE_EQ(tp->model_state, 14e9);
  in.sequence_parallel = true;
  auto sp = MakePlan(in);
  ASSERT_TRUE(sp.ok());
  EXPECT_DOUBLE_EQ(sp->activation_full, 134217728.0 / 8 * 194);  // sbh/t (34 + 5as/h)
  EXPECT_DOUBLE_EQ(sp->activation_selective, 134217728.0 / 8 * 34);
  EXPECT_DOUBLE_EQ(sp->activation_checkpoint, 134217728.0 * 2 / 8);
  in.flash_attention = true;
  auto fa = MakePlan(in);
  ASSERT_TRUE(fa.ok());
  EXPECT_DOUBLE_EQ(fa->activation_full, fa->activation_selective) << "no scores stored";
  EXPECT_EQ(fa->rungs[1].added_seconds, 0.0) << "nothing to recompute";
}

TEST(Planner, BytesPerElementScalesNotDoubles) {
  PlanInput in = SevenB(80);
  in.bytes_per_element = 4;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->activation_full, 2 * 134217728.0 * 194);
}

struct Forced {
  double hbm_gib;
  RungSet rungs;
  bool fits = true;  // false: nothing fits
};

class PlannerBudget : public ::testing::TestWithParam<Forced> {};

// Combination HBM needs and added seconds for the 7B case (DRAM 100 GB/s): keep 880.3 GiB;
// optimizer offload alone 802.1 (+0: its 1.96 s CPU step hides under 2.46 s of backward);
// selective 240.3 (+0.176); selective + optimizer offload 162.1 (+0.176); per-layer 116.6
// (+1.407); per-layer + optimizer offload 38.3 (+1.407); + checkpoints to DRAM 30.8 (+1.407);
// per-layer + parameter offload 13.9 (+3.306: 42 GB from NVMe in 7 s against 5.1 s of compute);
// + checkpoints to DRAM 6.4 (+3.306).
TEST_P(PlannerBudget, RecommendsTheCheapestThatFits) {
  auto p = MakePlan(SevenB(GetParam().hbm_gib));
  ASSERT_TRUE(p.ok());
  if (!GetParam().fits) {
    EXPECT_EQ(p->recommended_combination, -1);
    EXPECT_EQ(p->recommended, -1);
    return;
  }
  ASSERT_GE(p->recommended_combination, 0) << GetParam().hbm_gib << " GiB";
  EXPECT_EQ(RungSetName(p->combinations[p->recommended_combination].rungs),
            RungSetName(GetParam().rungs))
      << "budget " << GetParam().hbm_gib << " GiB";
}

using R = Rung;
INSTANTIATE_TEST_SUITE_P(
    SevenB, PlannerBudget,
    ::testing::Values(
        Forced{1000, 0}, Forced{850, Set({R::kOptimizerOffload})},
        Forced{250, Set({R::kSelectiveRecompute})},
        Forced{170, Set({R::kSelectiveRecompute, R::kOptimizerOffload})},
        // Per-layer recompute with and without optimizer offload cost the same: fewer rungs win.
        Forced{131, Set({R::kSelectiveRecompute, R::kFullRecompute})},
        // The README's budget: per-layer recompute with the optimizer state in DRAM.
        Forced{80, Set({R::kSelectiveRecompute, R::kFullRecompute, R::kOptimizerOffload})},
        Forced{35, Set({R::kSelectiveRecompute, R::kFullRecompute, R::kOptimizerOffload,
                        R::kActivationOffloadDram})},
        Forced{20, Set({R::kSelectiveRecompute, R::kFullRecompute, R::kOptimizerOffload,
                        R::kParameterOffload})},
        Forced{10, Set({R::kSelectiveRecompute, R::kFullRecompute, R::kOptimizerOffload,
                        R::kActivationOffloadDram, R::kParameterOffload})},
        Forced{5, 0, false}));

TEST(Planner, NvmeRungsNeedNvme) {
  PlanInput in = SevenB(20);
  in.nvme_bytes_per_s = 0;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->rungs[5].available);
  EXPECT_FALSE(p->rungs[6].fits);
  EXPECT_EQ(p->recommended, -1);
  for (const PlanPrice& c : p->combinations) {
    const bool nvme =
        (c.rungs & (RungBit(Rung::kActivationOffloadNvme) | RungBit(Rung::kParameterOffload))) != 0;
    EXPECT_EQ(c.available, !nvme) << RungSetName(c.rungs);
  }
}

// Without a DRAM bandwidth the CPU step cannot be priced: optimizer offload is left out rather
// than priced at zero.
TEST(Planner, OptimizerOffloadNeedsDramBandwidth) {
  PlanInput in = SevenB(80);
  in.dram_bytes_per_s = 0;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->optimizer_step_seconds, 0);
  for (const PlanPrice& c : p->combinations) {
    if ((c.rungs & RungBit(Rung::kOptimizerOffload)) != 0) {
      EXPECT_FALSE(c.available) << RungSetName(c.rungs);
      EXPECT_FALSE(c.fits) << RungSetName(c.rungs);
    }
  }
  // Without optimizer offload nothing fits in 80 GiB: the 104 GiB of model state stay in HBM.
  EXPECT_EQ(p->recommended_combination, -1);
}

// The CPU step: 28 B/param over the DRAM bandwidth, hidden while backward lasts longer, the
// difference added otherwise; the bytes per parameter can be overridden.
TEST(Planner, CpuOptimizerStepIsPriced) {
  PlanInput in = SevenB(80);
  in.dram_bytes_per_s = 25e9;  // 7.84 s of CPU step
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->optimizer_step_seconds, 28 * 7e9 / 25e9);
  EXPECT_DOUBLE_EQ(p->backward_seconds, 2 * p->forward_flops / 400e12);
  EXPECT_DOUBLE_EQ(p->optimizer_link_bytes, 4 * 7e9);  // 2 B/param of grads + 2 of params
  const RungSet s = Set({R::kSelectiveRecompute, R::kFullRecompute, R::kOptimizerOffload});
  const PlanPrice c = PriceRungSet(in, *p, s);
  EXPECT_DOUBLE_EQ(c.backward_seconds, p->backward_seconds + c.recompute_seconds);
  EXPECT_DOUBLE_EQ(c.optimizer_exposed_seconds, 28 * 7e9 / 25e9 - c.backward_seconds);
  EXPECT_GT(c.optimizer_exposed_seconds, 3.9);
  // Still the recommendation: nothing without optimizer offload fits in 80 GiB.
  EXPECT_EQ(p->combinations[p->recommended_combination].rungs, s);
  in.optimizer_bytes_per_param = 12;  // a kernel that moves less: 3.36 s, hidden under 3.87 s
  auto q = MakePlan(in);
  ASSERT_TRUE(q.ok());
  EXPECT_DOUBLE_EQ(q->optimizer_step_seconds, 12 * 7e9 / 25e9);
  EXPECT_EQ(PriceRungSet(in, *q, s).optimizer_exposed_seconds, 0);
}

TEST(Planner, BadInputNamesTheField) {
  PlanInput in = SevenB(80);
  in.heads = 0;
  auto p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("heads"), absl::string_view::npos);
  in = SevenB(80);
  in.dram_bytes_per_s = -1;
  p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("dram_bytes_per_s"), absl::string_view::npos);
  in = SevenB(80);
  in.optimizer_bytes_per_param = 0;
  p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("optimizer_bytes_per_param"), absl::string_view::npos);
  // Counts are whole, heads divide hidden, tensor parallelism splits whole heads.
  for (auto [field, set] : std::vector<std::pair<const char*, void (*)(PlanInput&)>>{
           {"layers", [](PlanInput& i) { i.layers = 2.5; }},
           {"hidden=2048 is not a multiple of heads=3",
            [](PlanInput& i) {
              i.hidden = 2048;
              i.heads = 3;
            }},
           {"tensor_parallel=3", [](PlanInput& i) { i.tensor_parallel = 3; }}}) {
    in = SevenB(80);
    set(in);
    p = MakePlan(in);
    ASSERT_FALSE(p.ok()) << field;
    EXPECT_NE(p.status().message().find(field), absl::string_view::npos) << p.status();
  }
  // Finite inputs whose plan would overflow are refused, not priced as infinities.
  for (auto set : std::vector<void (*)(PlanInput&)>{
           [](PlanInput& i) { i.layers = 1e308; }, [](PlanInput& i) { i.heads = 1e300; },
           [](PlanInput& i) { i.optimizer_bytes_per_param = 1e308; }}) {
    in = SevenB(80);
    in.dram_bytes_per_s = 50e9;
    set(in);
    if (in.heads > 1e299) in.hidden = 1e300;  // a multiple of heads
    p = MakePlan(in);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("too large to price"), absl::string_view::npos)
        << p.status();
  }
}

TEST(Planner, CApi) {
  // The same 7B case through the C structs.
  const PlanInput m = SevenB(131);
  tm_plan_input in = TM_PLAN_INPUT_INIT;
  in.layers = m.layers;
  in.hidden = m.hidden;
  in.heads = m.heads;
  in.seq = m.seq;
  in.micro_batch = m.micro_batch;
  in.params = m.params;
  in.hbm_bytes = m.hbm_bytes;
  in.link_bytes_per_s = m.link_bytes_per_s;
  in.nvme_bytes_per_s = m.nvme_bytes_per_s;
  in.flops_per_s = m.flops_per_s;
  tm_plan_result out = TM_PLAN_RESULT_INIT;
  ASSERT_EQ(tm_plan(&in, &out), TM_OK) << tm_last_error();
  EXPECT_EQ(out.recommended, TM_PLAN_FULL_RECOMPUTE);
  EXPECT_STREQ(tm_plan_rung_name(TM_PLAN_FULL_RECOMPUTE), "per-layer recompute");
  EXPECT_DOUBLE_EQ(out.activation_selective / kGiB, 4.25);
  EXPECT_EQ(out.recommended_rungs, TM_PLAN_RUNG_BIT(TM_PLAN_SELECTIVE_RECOMPUTE) |
                                       TM_PLAN_RUNG_BIT(TM_PLAN_FULL_RECOMPUTE));
  EXPECT_EQ(out.optimizer_step_seconds, 0) << "no DRAM bandwidth given";
  // With the DRAM bandwidth, at the README's 80 GiB: per-layer recompute + optimizer offload.
  in.dram_bytes_per_s = 100e9;
  in.hbm_bytes = 80 * kGiB;
  ASSERT_EQ(tm_plan(&in, &out), TM_OK) << tm_last_error();
  EXPECT_EQ(out.recommended, TM_PLAN_OPTIMIZER_OFFLOAD);
  EXPECT_EQ(out.recommended_rungs, TM_PLAN_RUNG_BIT(TM_PLAN_SELECTIVE_RECOMPUTE) |
                                       TM_PLAN_RUNG_BIT(TM_PLAN_FULL_RECOMPUTE) |
                                       TM_PLAN_RUNG_BIT(TM_PLAN_OPTIMIZER_OFFLOAD));
  EXPECT_NEAR(out.recommended_hbm_bytes / kGiB, 38.33, 0.01);
  EXPECT_NEAR(out.recommended_added_seconds, 1.4074, 1e-4);
  EXPECT_DOUBLE_EQ(out.optimizer_step_seconds, 1.96);
  // The step with its state on NVMe: 12 B/param read and written once at 6 GB/s; a DRAM tier
  // holding about 1 ms of the disk in reads ahead (8 x 6 MB) runs it at the disk's speed.
  EXPECT_DOUBLE_EQ(out.optimizer_state_bytes, 12 * 7e9);
  EXPECT_DOUBLE_EQ(out.optimizer_nvme_seconds, 2 * 12 * 7e9 / m.nvme_bytes_per_s);
  EXPECT_DOUBLE_EQ(out.optimizer_nvme_least_dram_bytes, 8 << 10);
  EXPECT_DOUBLE_EQ(out.optimizer_nvme_full_speed_dram_bytes,
                   std::max(16.0 * (1 << 20), 8e-3 * m.nvme_bytes_per_s));
  // A disk of 1 PB/s: never more DRAM than the state itself.
  tm_plan_input fast = in;
  fast.nvme_bytes_per_s = 1e15;
  tm_plan_result fast_out = TM_PLAN_RESULT_INIT;
  ASSERT_EQ(tm_plan(&fast, &fast_out), TM_OK) << tm_last_error();
  EXPECT_DOUBLE_EQ(fast_out.optimizer_nvme_full_speed_dram_bytes, 12 * 7e9);
  // A caller built before the NVMe fields: served up to backward_seconds.
  tm_plan_result mid_out = TM_PLAN_RESULT_INIT;
  mid_out.struct_size = offsetof(tm_plan_result, optimizer_state_bytes);
  mid_out.optimizer_state_bytes = 7;
  ASSERT_EQ(tm_plan(&in, &mid_out), TM_OK) << tm_last_error();
  EXPECT_DOUBLE_EQ(mid_out.optimizer_step_seconds, 1.96);
  EXPECT_EQ(mid_out.optimizer_state_bytes, 7) << "past its struct: not written";
  // A caller built before these fields: its smaller structs are still served, without them.
  tm_plan_result old_out = TM_PLAN_RESULT_INIT;
  old_out.struct_size = (offsetof(tm_plan_result, recommended_rungs) + 7) / 8 * 8;
  old_out.recommended_rungs = 12345;
  tm_plan_input old_in = in;
  old_in.struct_size = offsetof(tm_plan_input, dram_bytes_per_s);
  ASSERT_EQ(tm_plan(&old_in, &old_out), TM_OK) << tm_last_error();
  EXPECT_EQ(old_out.recommended, -1) << "without the DRAM field nothing fits in 80 GiB";
  EXPECT_EQ(old_out.recommended_rungs, 12345u) << "past the old struct: not written";
  old_in.struct_size = offsetof(tm_plan_input, dram_bytes_per_s) + 4;
  EXPECT_EQ(tm_plan(&old_in, &old_out), TM_ERR_INVALID_ARGUMENT);
  in.flops_per_s = 0;
  EXPECT_EQ(tm_plan(&in, &out), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("flops_per_s"), std::string::npos);
  EXPECT_EQ(tm_plan(nullptr, &out), TM_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(tm_plan_rung_name(static_cast<tm_plan_rung>(99)), "unknown");
}

}  // namespace
}  // namespace tiermem
