// The CPU Adam's pipeline sized to the DRAM tier: with the state on NVMe and a prefetch depth
// whose window (the bucket stepping and its new version, the buckets read ahead, the new versions
// written behind) would not fit the DRAM tier, the step waits for its own copies and goes on,
// with the result of the step over host memory; a bucket that cannot fit even alone is refused,
// the error saying how much DRAM it needs, and nothing changes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/api/runtime_state_tensors.h"
#include "lib/base/status.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/bucket_step.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"

namespace tiermem::optim {
namespace {

class Budget : public ::testing::Test {
 protected:
  // A runtime of dram_bytes (the DRAM tier and the staging pool) and buckets of `counts`
  // elements on NVMe; `inclusive`: TIERMEM_DRAM_INCLUSIVE.
  void Make(uint64_t dram_bytes, const std::vector<size_t>& counts, const char* inclusive = "off") {
    rt_ =
        testing::MakeRuntime(testing::Emulated(dir_.path(), 16ull << 20, dram_bytes, 256ull << 20),
                             {{"TIERMEM_DRAM_INCLUSIVE", inclusive}});
    ASSERT_NE(rt_, nullptr);
    io_ = std::make_unique<RuntimeStateTensors>(*rt_);
    AdamHyper h;
    h.lr = 1e-2;
    auto opt = AdamOptimizer::Create(h, 2, -1);
    ASSERT_TRUE(opt.ok());
    opt_ = std::move(*opt);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (size_t n : counts) {
      std::vector<float> state(3 * n);
      for (size_t i = 0; i < n; ++i) {
        state[i] = normal(rng);
        state[n + i] = 0.1f * normal(rng);
        state[2 * n + i] = 0.01f * std::abs(normal(rng));
      }
      std::vector<float> grad(n);
      for (auto& g : grad) g = normal(rng);
      auto t = rt_->CreateTensor({12 * n, TM_CLASS_OPTIMIZER_STATE, TM_TIER_NVME, "state"});
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE(rt_->Write(*t, 0, state.data(), 12 * n).ok());
      ASSERT_TRUE(rt_->Offload(*t, TM_TIER_NVME).ok());
      ASSERT_TRUE(rt_->Sync(*t).ok());
      tensors_.push_back(*t);
      host_.push_back(std::move(state));
      grads_.push_back(std::move(grad));
      counts_.push_back(n);
    }
  }
  void TearDown() override {
    if (rt_ != nullptr) versions_.Forget(*io_);
    io_.reset();
    rt_.reset();
  }
  BucketStepResult Step(uint64_t step, int depth) {
    std::vector<tm_adam_bucket> specs;
    for (size_t b = 0; b < tensors_.size(); ++b) {
      specs.push_back(
          {{tensors_[b]}, counts_[b], grads_[b].data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32});
    }
    return StepBuckets(*opt_, *io_, versions_, depth, step, 1.0f, specs.data(), specs.size());
  }
  void StepHost(uint64_t step) {
    for (size_t b = 0; b < tensors_.size(); ++b) {
      const size_t n = counts_[b];
      AdamSpan s;
      s.param = host_[b].data();
      s.m = host_[b].data() + n;
      s.v = host_[b].data() + 2 * n;
      s.grad = grads_[b].data();
      s.grad_type = Dtype::kF32;
      s.n = n;
      ASSERT_TRUE(opt_->Step(step, 1.0f, &s, 1).ok());
    }
  }
  bool Matches(size_t b) {
    std::vector<float> back(3 * counts_[b]);
    EXPECT_TRUE(rt_->Read(tensors_[b], 0, back.data(), back.size() * 4).ok());
    return std::memcmp(back.data(), host_[b].data(), back.size() * 4) == 0;
  }

  testing::TempDir dir_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<RuntimeStateTensors> io_;
  std::unique_ptr<AdamOptimizer> opt_;
  StepVersions versions_;
  std::vector<uint64_t> tensors_;
  std::vector<std::vector<float>> host_;
  std::vector<std::vector<float>> grads_;
  std::vector<size_t> counts_;
};

// Ten buckets of 480 KB of state in a 2 MiB DRAM tier, read 4 ahead: the window the depth asks
// for (2 + 2 * 4 buckets, 4.8 MB) is more than twice the tier, and one bucket with its new
// version takes almost half of it. Three steps, each equal to the host's.
TEST_F(Budget, WindowLargerThanTheTierStepsThrough) {
  Make(2ull << 20, std::vector<size_t>(10, 40000));
  for (uint64_t step = 1; step <= 3; ++step) {
    BucketStepResult r = Step(step, 4);
    ASSERT_TRUE(r.status.ok()) << "step " << step << ": " << r.status;
    EXPECT_EQ(r.buckets_done, tensors_.size());
    StepHost(step);
    for (size_t b = 0; b < tensors_.size(); ++b) EXPECT_TRUE(Matches(b)) << "bucket " << b;
  }
}

// Inclusive DRAM keeps a clean copy of what an offload wrote while there is room: the step,
// streaming state five times the DRAM tier through it, drops the old versions and the written
// new ones itself, so that no state read ahead is evicted for them and read twice. Each step
// reads and writes every state once.
TEST_F(Budget, StreamingStateIsReadOnce) {
  // 80 buckets of 64 KiB of state (5.2 MB), a sixteenth of the 1 MiB DRAM tier each, as
  // tiermem.torch slices them, read 4 ahead.
  Make(5ull << 18, std::vector<size_t>(80, 5440), "on");
  uint64_t state = 0;
  for (size_t n : counts_) state += 12 * n;
  for (uint64_t step = 1; step <= 3; ++step) {
    const tm_stats before = rt_->Stats();
    BucketStepResult r = Step(step, 4);
    ASSERT_TRUE(r.status.ok()) << "step " << step << ": " << r.status;
    const tm_stats after = rt_->Stats();
    EXPECT_EQ(after.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM] -
                  before.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM],
              state)
        << "step " << step << " read the state once";
    EXPECT_EQ(after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME] -
                  before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME],
              state)
        << "step " << step << " wrote the new state once";
    StepHost(step);
    for (size_t b = 0; b < tensors_.size(); ++b) EXPECT_TRUE(Matches(b)) << "bucket " << b;
  }
}

// Buckets of unequal sizes, the largest with its new version just under the DRAM tier's whole
// budget (1 MiB, beside the staging pool): the step goes on serially around them.
TEST_F(Budget, BucketNearlyHalfTheTierStepsAlone) {
  Make(5ull << 18, {10000, 43000, 5000, 20000, 43000});
  for (uint64_t step = 1; step <= 2; ++step) {
    BucketStepResult r = Step(step, 3);
    ASSERT_TRUE(r.status.ok()) << "step " << step << ": " << r.status;
    StepHost(step);
    for (size_t b = 0; b < tensors_.size(); ++b) EXPECT_TRUE(Matches(b)) << "bucket " << b;
  }
}

// A bucket whose state and new version cannot both be in DRAM: refused, naming the bucket and
// the DRAM it needs at once; every state is as before, and a later step of the buckets that fit
// is taken.
TEST_F(Budget, BucketThatCannotFitSaysWhatItNeeds) {
  Make(5ull << 18, {10000, 60000});  // 720 KB of state: 1.37 MiB with its new version
  BucketStepResult r = Step(1, 2);
  ASSERT_EQ(ToTmStatus(r.status), TM_ERR_OUT_OF_MEMORY) << r.status;
  EXPECT_EQ(r.buckets_done, 0u);
  const std::string msg(r.status.message());
  EXPECT_NE(msg.find("bucket 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs " + HumanBytes(2 * 12 * 60000) + " of DRAM at once"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the step was not taken"), std::string::npos) << msg;
  for (size_t b = 0; b < tensors_.size(); ++b) EXPECT_TRUE(Matches(b)) << "bucket " << b;
  EXPECT_TRUE(rt_->SyncAll().ok());
}

}  // namespace
}  // namespace tiermem::optim
