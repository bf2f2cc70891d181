// The CPU Adam over state in tiermem tensors: pipelined through DRAM from NVMe, the same result
// as the step over host memory, and a failed NVMe read that leaves every bucket either stepped
// whole or untouched (faults injected below the runtime, as in fault_test).
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "io/fault_injection.h"
#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/bucket_step.h"
#include "lib/optim/runtime_state.h"
#include "lib/runtime/runtime.h"
#include "test_util.h"

namespace tiermem::optim {
namespace {

class FailReads : public io::FaultInjector {
 public:
  std::atomic<bool> armed{false};
  int OnCompletion(const io::IoRequest& r, uint64_t, uint64_t, int result) override {
    return armed.load() && !r.write ? -EIO : result;
  }
};

constexpr size_t kBuckets = 4;

class Buckets : public ::testing::Test {
 protected:
  void SetUp() override {
    io::SetFaultInjector(&faults_);
    ConfigOverrides o;
    o.device = DeviceKind::kEmulated;
    o.hbm_bytes = SizeSetting{16ull << 20, 0};
    o.dram_bytes = SizeSetting{64ull << 20, 0};
    o.nvme_bytes = SizeSetting{128ull << 20, 0};
    o.nvme_paths = dir_.path();
    auto cfg = LoadConfig(o, [](const char*) { return std::nullopt; }, {});
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    auto rt = Runtime::Create(*cfg);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::move(*rt);
    AdamHyper h;
    h.lr = 1e-2;
    h.weight_decay = 0.05;
    auto opt = AdamOptimizer::Create(h, 2, -1);
    ASSERT_TRUE(opt.ok());
    opt_ = std::move(*opt);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    for (size_t b = 0; b < kBuckets; ++b) {
      const size_t n = 50000 + 777 * b;  // 600 KB and up of state each
      counts_.push_back(n);
      std::vector<float> state(3 * n);
      for (size_t i = 0; i < n; ++i) {
        state[i] = normal(rng);
        state[2 * n + i] = 0.01f * std::abs(normal(rng));
        state[n + i] = 0.1f * normal(rng);
      }
      std::vector<uint16_t> grad(n);
      for (auto& g : grad) g = FloatToBits(normal(rng));
      auto t = rt_->CreateTensor({12 * n, TM_CLASS_OPTIMIZER_STATE, TM_TIER_NVME, "adam state"});
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE(rt_->Write(*t, 0, state.data(), 12 * n).ok());
      tensors_.push_back(*t);
      host_.push_back(std::move(state));
      grads_.push_back(std::move(grad));
      out_.emplace_back(n, 0);
    }
  }
  void TearDown() override {
    rt_.reset();
    io::SetFaultInjector(nullptr);
  }
  static uint16_t FloatToBits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>(u >> 16);  // a bf16 gradient
  }
  // The state written lands on NVMe, its home: DRAM is reached by a prefetch.
  void Place(size_t b, tm_tier tier) {
    if (tier == TM_TIER_DRAM) {
      // Brought up, then rewritten in place: DRAM holds the only copy (a prefetched or kept
      // DRAM copy beside the NVMe one is a clean copy of state that lives on NVMe).
      ASSERT_TRUE(rt_->Prefetch(tensors_[b], tier).ok());
      ASSERT_TRUE(rt_->Sync(tensors_[b]).ok());
      std::vector<char> bytes(*rt_->TensorBytes(tensors_[b]));
      ASSERT_TRUE(rt_->Read(tensors_[b], 0, bytes.data(), bytes.size()).ok());
      ASSERT_TRUE(rt_->Write(tensors_[b], 0, bytes.data(), bytes.size()).ok());
    } else {
      ASSERT_TRUE(rt_->Offload(tensors_[b], tier).ok());
    }
    ASSERT_TRUE(rt_->Sync(tensors_[b]).ok());
    ASSERT_NE(*rt_->Residency(tensors_[b]) & TM_TIER_BIT(tier), 0u);
  }
  std::vector<tm_adam_bucket> Specs() {
    std::vector<tm_adam_bucket> v;
    for (size_t b = 0; b < kBuckets; ++b) {
      v.push_back({{tensors_[b]},
                   counts_[b],
                   grads_[b].data(),
                   TM_DTYPE_BF16,
                   out_[b].data(),
                   TM_DTYPE_BF16});
    }
    return v;
  }
  // The same step over the host copy of bucket b.
  void StepHost(size_t b, uint64_t step) {
    const size_t n = counts_[b];
    std::vector<uint16_t> out(n);
    AdamSpan s;
    s.param = host_[b].data();
    s.m = host_[b].data() + n;
    s.v = host_[b].data() + 2 * n;
    s.grad = grads_[b].data();
    s.grad_type = Dtype::kBF16;
    s.n = n;
    ASSERT_TRUE(opt_->Step(step, 1.0f, &s, 1).ok());
  }
  bool Matches(size_t b) {
    std::vector<float> back(3 * counts_[b]);
    EXPECT_TRUE(rt_->Read(tensors_[b], 0, back.data(), back.size() * 4).ok());
    return std::memcmp(back.data(), host_[b].data(), back.size() * 4) == 0;
  }

  FailReads faults_;
  testing::TempDir dir_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<AdamOptimizer> opt_;
  std::vector<uint64_t> tensors_;
  std::vector<size_t> counts_;
  std::vector<std::vector<float>> host_;
  std::vector<std::vector<uint16_t>> grads_;
  std::vector<std::vector<uint16_t>> out_;
};

TEST_F(Buckets, StateOnNvmeIsSteppedThroughDramAndWrittenBack) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_NVME);
  RuntimeStateTensors tensors(*rt_);
  auto specs = Specs();
  for (uint64_t step = 1; step <= 3; ++step) {
    BucketStepResult r = StepBuckets(*opt_, tensors, 2, step, 1.0f, specs.data(), specs.size());
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.buckets_done, kBuckets);
    for (size_t b = 0; b < kBuckets; ++b) {
      StepHost(b, step);
      // Back on NVMe (DRAM may keep a clean copy: TIERMEM_DRAM_INCLUSIVE), never in HBM.
      EXPECT_EQ(*rt_->Residency(tensors_[b]) & ~TM_TIER_BIT(TM_TIER_DRAM),
                TM_TIER_BIT(TM_TIER_NVME))
          << "bucket " << b << " went back to NVMe";
      EXPECT_TRUE(Matches(b)) << "bucket " << b << " step " << step;
    }
  }
  EXPECT_NE(out_[0][0], 0) << "the bf16 parameter copy was written";
}

TEST_F(Buckets, StateInDramStaysThere) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_DRAM);
  RuntimeStateTensors tensors(*rt_);
  auto specs = Specs();
  BucketStepResult r = StepBuckets(*opt_, tensors, 1, 1, 1.0f, specs.data(), specs.size());
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (size_t b = 0; b < kBuckets; ++b) {
    StepHost(b, 1);
    EXPECT_EQ(*rt_->Residency(tensors_[b]), TM_TIER_BIT(TM_TIER_DRAM)) << "stepped in place";
    EXPECT_TRUE(Matches(b)) << b;
  }
}

TEST_F(Buckets, FailedReadLeavesTheBucketAndThoseAfterItUntouched) {
  Place(0, TM_TIER_DRAM);
  Place(1, TM_TIER_DRAM);
  Place(2, TM_TIER_NVME);
  Place(3, TM_TIER_NVME);
  RuntimeStateTensors tensors(*rt_);
  auto specs = Specs();
  faults_.armed = true;
  BucketStepResult r = StepBuckets(*opt_, tensors, 2, 1, 1.0f, specs.data(), specs.size());
  EXPECT_EQ(ToTmStatus(r.status), TM_ERR_IO) << r.status;
  EXPECT_NE(r.status.message().find("bucket 2"), absl::string_view::npos) << r.status;
  EXPECT_NE(r.status.message().find("Input/output error"), absl::string_view::npos) << r.status;
  ASSERT_EQ(r.buckets_done, 2u);
  faults_.armed = false;
  for (size_t b = 0; b < 2; ++b) StepHost(b, 1);
  for (size_t b = 0; b < kBuckets; ++b) {
    EXPECT_TRUE(Matches(b)) << "bucket " << b << (b < 2 ? " stepped" : " untouched");
  }
  EXPECT_TRUE(rt_->SyncAll().ok()) << "no failure left behind to surprise a later sync";
  // The rest of the step, once the disk reads again, completes it.
  r = StepBuckets(*opt_, tensors, 2, 1, 1.0f, specs.data() + 2, 2);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.buckets_done, 2u);
  for (size_t b = 2; b < kBuckets; ++b) StepHost(b, 1);
  for (size_t b = 0; b < kBuckets; ++b) EXPECT_TRUE(Matches(b)) << b;
}

TEST_F(Buckets, FailedFirstReadStepsNothing) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_NVME);
  RuntimeStateTensors tensors(*rt_);
  auto specs = Specs();
  faults_.armed = true;
  BucketStepResult r = StepBuckets(*opt_, tensors, 3, 1, 1.0f, specs.data(), specs.size());
  EXPECT_EQ(ToTmStatus(r.status), TM_ERR_IO) << r.status;
  EXPECT_EQ(r.buckets_done, 0u);
  faults_.armed = false;
  for (size_t b = 0; b < kBuckets; ++b) EXPECT_TRUE(Matches(b)) << "bucket " << b << " untouched";
}

TEST_F(Buckets, TooSmallStateIsRefusedBeforeAnythingMoves) {
  RuntimeStateTensors tensors(*rt_);
  auto specs = Specs();
  specs[3].count += 1;
  BucketStepResult r = StepBuckets(*opt_, tensors, 2, 1, 1.0f, specs.data(), specs.size());
  EXPECT_EQ(ToTmStatus(r.status), TM_ERR_INVALID_ARGUMENT) << r.status;
  EXPECT_NE(r.status.message().find("bucket 3"), absl::string_view::npos) << r.status;
  EXPECT_EQ(r.buckets_done, 0u);
  for (size_t b = 0; b < kBuckets; ++b) EXPECT_TRUE(Matches(b)) << b;
}

}  // namespace
}  // namespace tiermem::optim
