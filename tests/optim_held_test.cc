// An Adam step holds its state tensors from its check to its return: a write to one by another
// thread meanwhile (tm_tensor_write, copy_in, an acquire for writing) gets TM_ERR_BUSY naming the
// tensor, instead of TM_OK and bytes the step's commit then loses. The step itself is unchanged
// (its result equals a step with no such write), and once it returns the same write succeeds.
// The write is made from inside the step, deterministically: the tensor operations the step
// calls are wrapped, and the first acquire runs it on a second thread before going on.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lib/api/runtime_state_tensors.h"
#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/bucket_step.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"

namespace tiermem::optim {
namespace {

constexpr size_t kN = 20000;

// The runtime's tensor operations, with writes to `target` from another thread at the step's
// first acquire.
class Intruding : public RuntimeStateTensors {
 public:
  Intruding(Runtime& rt, uint64_t target) : RuntimeStateTensors(rt), rt_(rt), target_(target) {}
  absl::StatusOr<void*> Acquire(uint64_t t, tm_tier tier, tm_access access) override {
    if (!tried_) {
      tried_ = true;
      std::thread other([&] {
        std::vector<float> junk(3 * kN, 123.0f);
        seen_.push_back(rt_.Write(target_, 0, junk.data(), 12 * kN));
        seen_.push_back(rt_.Acquire(target_, TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr).status());
        seen_.push_back(rt_.Acquire(target_, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr).status());
      });
      other.join();
    }
    return RuntimeStateTensors::Acquire(t, tier, access);
  }
  std::vector<absl::Status> seen_;

 private:
  Runtime& rt_;
  const uint64_t target_;
  bool tried_ = false;
};

class Held : public ::testing::TestWithParam<tm_tier> {};

TEST_P(Held, WriteByAnotherThreadDuringTheStepIsRefusedNotLost) {
  testing::TempDir dir;
  auto rt =
      testing::MakeRuntime(testing::Emulated(dir.path(), 16ull << 20, 64ull << 20, 128ull << 20));
  ASSERT_NE(rt, nullptr);
  auto t = rt->CreateTensor({12 * kN, TM_CLASS_OPTIMIZER_STATE, GetParam(), "held state"});
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> state(3 * kN, 0.0f), grad(kN, 0.25f);
  for (size_t i = 0; i < kN; ++i) state[i] = 1.0f + 0.001f * static_cast<float>(i);
  ASSERT_TRUE(rt->Write(*t, 0, state.data(), 12 * kN).ok());
  auto opt = AdamOptimizer::Create(AdamHyper{}, 1, -1);
  ASSERT_TRUE(opt.ok());
  Intruding io(*rt, *t);
  StepVersions versions;
  const tm_adam_bucket bucket = {{*t}, kN, grad.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32};
  BucketStepResult r = StepBuckets(**opt, io, versions, 2, 1, 1.0f, &bucket, 1);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.buckets_done, 1u);
  ASSERT_EQ(io.seen_.size(), 3u) << "the step never acquired: nothing was tried";
  for (const absl::Status& s : io.seen_) {
    EXPECT_EQ(ToTmStatus(s), TM_ERR_BUSY) << s;
    EXPECT_NE(s.message().find("\"held state\""), std::string::npos) << s;
    EXPECT_NE(s.message().find("Adam step"), std::string::npos) << s;
  }
  // The step's result is the same step over host memory: nothing of the refused writes landed.
  auto host = AdamOptimizer::Create(AdamHyper{}, 1, -1);
  ASSERT_TRUE(host.ok());
  AdamSpan span{};
  span.n = kN;
  span.param = state.data();
  span.m = state.data() + kN;
  span.v = state.data() + 2 * kN;
  span.grad = grad.data();
  span.grad_type = Dtype::kF32;
  span.out = nullptr;
  ASSERT_TRUE((*host)->Step(1, 1.0f, &span, 1).ok());
  std::vector<float> back(3 * kN);
  ASSERT_TRUE(rt->Read(*t, 0, back.data(), 12 * kN).ok());
  EXPECT_EQ(std::memcmp(back.data(), state.data(), 12 * kN), 0);
  // Let go with the step: the same write now lands.
  std::vector<float> later(3 * kN, 7.0f);
  std::thread after([&] { EXPECT_TRUE(rt->Write(*t, 0, later.data(), 12 * kN).ok()); });
  after.join();
  ASSERT_TRUE(rt->Read(*t, 0, back.data(), 12 * kN).ok());
  EXPECT_EQ(back, later);
  versions.Forget(io);
}

INSTANTIATE_TEST_SUITE_P(Homes, Held, ::testing::Values(TM_TIER_DRAM, TM_TIER_NVME),
                         [](const ::testing::TestParamInfo<tm_tier>& info) {
                           return std::string(tm_tier_name(info.param));
                         });

}  // namespace
}  // namespace tiermem::optim
