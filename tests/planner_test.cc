// The planner against hand-computed cases (Korthikanti et al. 2022 formulas, units carried
// through), with tensor and sequence parallelism, and budgets that force each rung.
#include "lib/plan/planner.h"

#include <gtest/gtest.h>

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
  return in;
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
  int rung;  // -1: nothing fits
};

class PlannerBudget : public ::testing::TestWithParam<Forced> {};

// Rung HBM needs for the 7B case: keep 880.3 GiB, selective 240.3, per-layer 116.6, optimizer
// offload 162.1, activation offload 34.6, parameter offload 10.1.
TEST_P(PlannerBudget, RecommendsTheCheapestThatFits) {
  auto p = MakePlan(SevenB(GetParam().hbm_gib));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->recommended, GetParam().rung)
      << "budget " << GetParam().hbm_gib << " GiB -> "
      << (p->recommended >= 0 ? RungName(p->rungs[p->recommended].rung) : "none");
}

INSTANTIATE_TEST_SUITE_P(SevenB, PlannerBudget,
                         ::testing::Values(Forced{1000, 0}, Forced{250, 1}, Forced{131, 2},
                                           Forced{170, 3}, Forced{50, 4}, Forced{20, 6},
                                           Forced{5, -1}));

TEST(Planner, NvmeRungsNeedNvme) {
  PlanInput in = SevenB(20);
  in.nvme_bytes_per_s = 0;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->rungs[5].available);
  EXPECT_FALSE(p->rungs[6].fits);
  EXPECT_EQ(p->recommended, -1);
}

TEST(Planner, BadInputNamesTheField) {
  PlanInput in = SevenB(80);
  in.heads = 0;
  auto p = MakePlan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("heads"), absl::string_view::npos);
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
  in.flops_per_s = 0;
  EXPECT_EQ(tm_plan(&in, &out), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("flops_per_s"), std::string::npos);
  EXPECT_EQ(tm_plan(nullptr, &out), TM_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(tm_plan_rung_name(static_cast<tm_plan_rung>(99)), "unknown");
}

}  // namespace
}  // namespace tiermem
