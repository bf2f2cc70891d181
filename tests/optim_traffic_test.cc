// The bucket pipeline's NVMe traffic: a step over state homed on NVMe reads each bucket's state
// once and writes its new version once, even when DRAM holds only a few buckets at a time (the
// bound optim_bench sets the step beside assumes exactly that). A bucket read ahead and dropped
// for room before its turn would be read twice.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "lib/api/runtime_state_tensors.h"
#include "lib/config/config.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/bucket_step.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"

namespace tiermem::optim {
namespace {

constexpr size_t kBuckets = 24;
constexpr size_t kCount = 65536;  // 768 KiB of state per bucket
constexpr uint64_t kStateBytes = 12 * kCount;

class Traffic : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    // DRAM: room for the pipeline, one bucket more and the staging ring: the bucket stepping,
    // its new version, the `depth` read ahead and the `depth + 1` new versions being written
    // (bucket_step.cc).
    const uint64_t depth = static_cast<uint64_t>(GetParam());
    const ConfigOverrides o =
        testing::Emulated(dir_.path(), 4ull << 20, (2 + 2 * depth + 1) * kStateBytes + (2ull << 20),
                          3 * kBuckets * kStateBytes);
    // Exclusive tiers: every step reads its state from NVMe.
    rt_ = testing::MakeRuntime(o, {{"TIERMEM_DRAM_INCLUSIVE", "off"}});
    ASSERT_NE(rt_, nullptr);
    io_ = std::make_unique<RuntimeStateTensors>(*rt_);
    // The staging ring takes its share of the budget: the pipeline's buckets still fit.
    ASSERT_GE(rt_->info().tier_bytes[TM_TIER_DRAM], (2 + 2 * depth) * kStateBytes);
    auto opt = AdamOptimizer::Create(AdamHyper{}, 2, -1);
    ASSERT_TRUE(opt.ok());
    opt_ = std::move(*opt);
    std::vector<float> state(3 * kCount, 0.5f);
    for (size_t b = 0; b < kBuckets; ++b) {
      auto t = rt_->CreateTensor({kStateBytes, TM_CLASS_OPTIMIZER_STATE, TM_TIER_NVME, "state"});
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE(rt_->Write(*t, 0, state.data(), kStateBytes).ok());
      ASSERT_TRUE(rt_->Offload(*t, TM_TIER_NVME).ok());
      buckets_.push_back({{*t}, kCount, grad_.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32});
    }
    ASSERT_TRUE(rt_->SyncAll().ok());
  }
  void TearDown() override {
    if (rt_ != nullptr) versions_.Forget(*io_);
    io_.reset();
    rt_.reset();
  }

  testing::TempDir dir_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<RuntimeStateTensors> io_;
  std::unique_ptr<AdamOptimizer> opt_;
  StepVersions versions_;
  std::vector<float> grad_ = std::vector<float>(kCount, 0.01f);
  std::vector<tm_adam_bucket> buckets_;
};

TEST_P(Traffic, EachBucketIsReadOnceAndWrittenOnce) {
  const int depth = GetParam();
  for (uint64_t step = 1; step <= 3; ++step) {  // the first creates the shadows, later reuse them
    const tm_stats before = rt_->Stats();
    BucketStepResult r =
        StepBuckets(*opt_, *io_, versions_, depth, step, 1.0f, buckets_.data(), buckets_.size());
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_TRUE(rt_->SyncAll().ok());
    const tm_stats after = rt_->Stats();
    const uint64_t read = after.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM] -
                          before.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM];
    const uint64_t written = after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME] -
                             before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME];
    EXPECT_EQ(read, kBuckets * kStateBytes) << "step " << step << ", depth " << depth;
    EXPECT_EQ(written, kBuckets * kStateBytes) << "step " << step << ", depth " << depth;
  }
}

INSTANTIATE_TEST_SUITE_P(PrefetchDepths, Traffic, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace tiermem::optim
