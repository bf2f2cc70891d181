// The copy-state transitions of lib/runtime/tensor.h: each checks its starting state when checks
// are on (debug and sanitizer builds; switched on here), and a wrong one aborts naming it.
#include <gtest/gtest.h>

#include "lib/runtime/tensor.h"

namespace tiermem {
namespace {

class TensorState : public ::testing::Test {
 protected:
  void SetUp() override {
    was_ = TransitionChecksOn();
    SetTransitionChecks(true);
    t_.name = "t";
    t_.bytes = 4096;
  }
  void TearDown() override { SetTransitionChecks(was_); }
  Tensor t_;
  bool was_ = false;
};

TEST_F(TensorState, TheDocumentedTransitionsPass) {
  const Extent e{0, 4096};
  t_.BeginFill(TM_TIER_DRAM, e);
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kFilling);
  t_.EndFill(TM_TIER_DRAM);
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kValid);
  t_.PinWrite(TM_TIER_DRAM);
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kWriting);
  t_.UnpinWrite(TM_TIER_DRAM);
  t_.Land(TM_TIER_DRAM, io::CopyTicket{});
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kLanding);
  t_.Landed(TM_TIER_DRAM);
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kValid);
  EXPECT_EQ(t_.Drop(TM_TIER_DRAM).size, 4096u);
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kAbsent);
  t_.BeginFill(TM_TIER_HBM, e);  // a fresh reservation for a write acquire
  t_.PinWrite(TM_TIER_HBM);
  EXPECT_EQ(t_.copy(TM_TIER_HBM).state, CopyState::kWriting);
  t_.PinWrite(TM_TIER_HBM);  // acquired for writing again in the same tier
  EXPECT_EQ(t_.copy(TM_TIER_HBM).state, CopyState::kWriting);
}

using TensorStateDeathTest = TensorState;

TEST_F(TensorStateDeathTest, AWrongStartingStateAbortsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(t_.EndFill(TM_TIER_DRAM),
               "bad copy-state transition EndFill of tensor \"t\" in "
               "dram: the copy is absent");
  EXPECT_DEATH(t_.Landed(TM_TIER_HBM), "Landed .* the copy is absent");
  t_.BeginFill(TM_TIER_DRAM, Extent{0, 4096});
  EXPECT_DEATH(t_.BeginFill(TM_TIER_DRAM, Extent{0, 4096}), "BeginFill .* the copy is filling");
  EXPECT_DEATH(t_.UnpinWrite(TM_TIER_DRAM), "UnpinWrite .* the copy is filling");
  t_.EndFill(TM_TIER_DRAM);
  ++t_.copy(TM_TIER_DRAM).pins;
  EXPECT_DEATH(t_.Drop(TM_TIER_DRAM), "Drop \\(pinned\\) .* the copy is valid \\(1 pin");
}

TEST_F(TensorState, ChecksOffLetAWrongTransitionThrough) {
  // Release builds without the sanitizers keep the transitions free of checks.
  SetTransitionChecks(false);
  t_.EndFill(TM_TIER_DRAM);
  EXPECT_EQ(t_.copy(TM_TIER_DRAM).state, CopyState::kValid);
}

}  // namespace
}  // namespace tiermem
