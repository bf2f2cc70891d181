// The CPU Adam over state in tiermem tensors: pipelined through DRAM from NVMe, the same result
// as the step over host memory, and all or nothing: a failed NVMe read (of the first, a middle or
// the last bucket) or write leaves every state and every updated-parameter buffer bit-identical,
// and the next step equals a clean one (faults injected below the runtime, as in fault_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "io/fault_injection.h"
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

// Fails reads that touch [lo, hi) of the swap file, or writes after the first `writes_ok`
// pieces; records the ranges read while `record` is on.
class Faults : public io::FaultInjector {
 public:
  std::atomic<bool> reads{false}, writes{false}, record{false};
  std::atomic<uint64_t> lo{0}, hi{UINT64_MAX};
  std::atomic<int> writes_ok{0};
  std::mutex mu;
  uint64_t seen_lo = UINT64_MAX, seen_hi = 0;
  int OnCompletion(const io::IoRequest& r, uint64_t offset, uint64_t length, int result) override {
    if (r.write) return writes.load() && writes_ok.fetch_sub(1) <= 0 ? -EIO : result;
    if (record.load()) {
      std::lock_guard<std::mutex> lock(mu);
      seen_lo = std::min(seen_lo, offset);
      seen_hi = std::max(seen_hi, offset + length);
    }
    return reads.load() && offset < hi.load() && offset + length > lo.load() ? -EIO : result;
  }
};

constexpr size_t kBuckets = 4;

class Buckets : public ::testing::Test {
 protected:
  void SetUp() override {
    io::SetFaultInjector(&faults_);
    // Exclusive tiers: the faults strike NVMe itself, which inclusive DRAM's clean copies would
    // otherwise stand in for.
    rt_ =
        testing::MakeRuntime(testing::Emulated(dir_.path(), 16ull << 20, 64ull << 20, 128ull << 20),
                             {{"TIERMEM_DRAM_INCLUSIVE", "off"}});
    ASSERT_NE(rt_, nullptr);
    state_io_ = std::make_unique<RuntimeStateTensors>(*rt_);
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
      out_.emplace_back(n, kUntouched);
    }
  }
  void TearDown() override {
    if (rt_ != nullptr) versions_.Forget(*state_io_);
    state_io_.reset();
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
  BucketStepResult Step(uint64_t step, int depth, const tm_adam_bucket* specs, size_t count) {
    return StepBuckets(*opt_, *state_io_, versions_, depth, step, 1.0f, specs, count);
  }
  // The same step over the host copy of bucket b; its bf16 parameters into want_[b].
  void StepHost(size_t b, uint64_t step) {
    const size_t n = counts_[b];
    want_.resize(kBuckets);
    want_[b].assign(n, 0);
    AdamSpan s;
    s.out = want_[b].data();
    s.out_type = Dtype::kBF16;
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

  // The swap-file range that bucket b's state occupies: recorded from a read of it (NVMe only).
  void RangeOf(size_t b, uint64_t* lo, uint64_t* hi) {
    ASSERT_EQ(*rt_->Residency(tensors_[b]), TM_TIER_BIT(TM_TIER_NVME));
    faults_.seen_lo = UINT64_MAX;
    faults_.seen_hi = 0;
    faults_.record = true;
    std::vector<char> bytes(*rt_->TensorBytes(tensors_[b]));
    ASSERT_TRUE(rt_->Read(tensors_[b], 0, bytes.data(), bytes.size()).ok());
    faults_.record = false;
    ASSERT_LT(faults_.seen_lo, faults_.seen_hi) << "bucket " << b << " was read from NVMe";
    *lo = faults_.seen_lo;
    *hi = faults_.seen_hi;
  }
  // Every state and every updated-parameter buffer is as before the failed step.
  void ExpectUntouched() {
    for (size_t b = 0; b < kBuckets; ++b) {
      EXPECT_TRUE(Matches(b)) << "bucket " << b << "'s state is as before";
      EXPECT_EQ(std::count(out_[b].begin(), out_[b].end(), kUntouched),
                static_cast<long>(out_[b].size()))
          << "bucket " << b << "'s parameters were not written";
    }
    EXPECT_TRUE(rt_->SyncAll().ok()) << "no failure left behind to surprise a later sync";
  }
  // With the fault gone, the step is taken and equals a clean one.
  void ExpectCleanStep(uint64_t step) {
    auto specs = Specs();
    BucketStepResult r = Step(step, 2, specs.data(), specs.size());
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.buckets_done, kBuckets);
    for (size_t b = 0; b < kBuckets; ++b) {
      StepHost(b, step);
      EXPECT_TRUE(Matches(b)) << "bucket " << b << " step " << step;
      EXPECT_EQ(out_[b], want_[b]) << "bucket " << b << "'s parameters, step " << step;
    }
  }
  void ExpectRefused(const BucketStepResult& r, tm_status code, const std::string& bucket) {
    EXPECT_EQ(ToTmStatus(r.status), code) << r.status;
    EXPECT_EQ(r.buckets_done, 0u);
    const std::string msg(r.status.message());
    EXPECT_NE(msg.find(bucket), std::string::npos) << msg;
    EXPECT_NE(msg.find("Input/output error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the step was not taken"), std::string::npos) << msg;
  }

  static constexpr uint16_t kUntouched = 0xabcd;
  Faults faults_;
  testing::TempDir dir_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<AdamOptimizer> opt_;
  std::vector<uint64_t> tensors_;
  std::vector<size_t> counts_;
  std::vector<std::vector<float>> host_;
  std::vector<std::vector<uint16_t>> grads_;
  std::vector<std::vector<uint16_t>> out_;
  std::vector<std::vector<uint16_t>> want_;
  std::unique_ptr<RuntimeStateTensors> state_io_;
  StepVersions versions_;
};

TEST_F(Buckets, StateOnNvmeIsSteppedThroughDramAndWrittenBack) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_NVME);
  auto specs = Specs();
  for (uint64_t step = 1; step <= 3; ++step) {
    BucketStepResult r = Step(step, 2, specs.data(), specs.size());
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.buckets_done, kBuckets);
    for (size_t b = 0; b < kBuckets; ++b) {
      StepHost(b, step);
      // Back on NVMe (DRAM may keep a clean copy), never in HBM.
      EXPECT_EQ(*rt_->Residency(tensors_[b]) & ~TM_TIER_BIT(TM_TIER_DRAM),
                TM_TIER_BIT(TM_TIER_NVME))
          << "bucket " << b << " went back to NVMe";
      EXPECT_TRUE(Matches(b)) << "bucket " << b << " step " << step;
      EXPECT_EQ(out_[b], want_[b]) << "bucket " << b << " step " << step;
    }
  }
  EXPECT_EQ(versions_.shadow_of.size(), kBuckets) << "one shadow per NVMe state, kept";
  // A state destroyed: its shadow goes at the next step.
  ASSERT_TRUE(rt_->DestroyTensor(tensors_[3]).ok());
  BucketStepResult r = Step(4, 2, specs.data(), 3);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(versions_.shadow_of.size(), kBuckets - 1);
  EXPECT_EQ(versions_.shadow_of.count(tensors_[3]), 0u);
  tensors_.pop_back();
}

TEST_F(Buckets, StateInDramStaysThere) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_DRAM);
  auto specs = Specs();
  BucketStepResult r = Step(1, 1, specs.data(), specs.size());
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (size_t b = 0; b < kBuckets; ++b) {
    StepHost(b, 1);
    EXPECT_EQ(*rt_->Residency(tensors_[b]), TM_TIER_BIT(TM_TIER_DRAM)) << "stepped in place";
    EXPECT_TRUE(Matches(b)) << b;
    EXPECT_EQ(out_[b], want_[b]) << b;
  }
  EXPECT_TRUE(versions_.shadow_of.empty()) << "DRAM state needs no shadow";
}

// A read failure of the first, a middle or the last NVMe bucket, with a DRAM bucket among them
// and read-ahead on: nothing changes, and the next step is a clean one.
class ReadFailure : public Buckets, public ::testing::WithParamInterface<size_t> {};

TEST_P(ReadFailure, LeavesEveryStateAndParameterAsItWas) {
  const size_t failing = GetParam();
  Place(0, TM_TIER_NVME);
  Place(1, TM_TIER_DRAM);
  Place(2, TM_TIER_NVME);
  Place(3, TM_TIER_NVME);
  uint64_t lo = 0, hi = 0;
  RangeOf(failing, &lo, &hi);
  faults_.lo = lo;
  faults_.hi = hi;
  faults_.reads = true;
  auto specs = Specs();
  BucketStepResult r = Step(1, 2, specs.data(), specs.size());
  faults_.reads = false;
  ExpectRefused(r, TM_ERR_IO, "bucket " + std::to_string(failing));
  ExpectUntouched();
  ExpectCleanStep(1);
  ExpectCleanStep(2);
}

INSTANTIATE_TEST_SUITE_P(FirstMiddleLast, ReadFailure, ::testing::Values(0u, 2u, 3u));

// The new state's write to NVMe fails, on the first piece written or on a later one.
class WriteFailure : public Buckets, public ::testing::WithParamInterface<int> {};

TEST_P(WriteFailure, LeavesEveryStateAndParameterAsItWas) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_NVME);
  Place(1, TM_TIER_DRAM);
  faults_.writes_ok = GetParam();
  faults_.writes = true;
  auto specs = Specs();
  BucketStepResult r = Step(1, 2, specs.data(), specs.size());
  faults_.writes = false;
  ExpectRefused(r, TM_ERR_IO, "writing its new state to NVMe");
  ExpectUntouched();
  ExpectCleanStep(1);
}

INSTANTIATE_TEST_SUITE_P(FirstAndLater, WriteFailure, ::testing::Values(0, 2));

TEST_F(Buckets, AStepAfterAStepIsTheSameAfterAFailureBetween) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_NVME);
  ExpectCleanStep(1);  // the shadows exist now and hold the previous version
  faults_.writes = true;
  auto specs = Specs();
  for (size_t b = 0; b < kBuckets; ++b) out_[b].assign(counts_[b], kUntouched);
  BucketStepResult r = Step(2, 2, specs.data(), specs.size());
  faults_.writes = false;
  ExpectRefused(r, TM_ERR_IO, "writing its new state to NVMe");
  ExpectUntouched();
  ExpectCleanStep(2);
}

// Two parameter groups with their own hyperparameters and step numbers in one step: a read
// failure in the second group's bucket leaves the first group untouched too, and the step once
// the fault is gone equals each group stepped on its own.
TEST_F(Buckets, GroupsAreAllOrNothingTogether) {
  for (size_t b = 0; b < kBuckets; ++b) Place(b, TM_TIER_NVME);
  Place(1, TM_TIER_DRAM);
  AdamHyper other = opt_->hyper();
  other.lr = 3e-3;
  other.weight_decay = 0.0;
  auto specs = Specs();
  const std::vector<BucketGroup> groups = {{opt_->hyper(), 1, specs.data(), 2},
                                           {other, 4, specs.data() + 2, 2}};
  uint64_t lo = 0, hi = 0;
  RangeOf(3, &lo, &hi);
  faults_.lo = lo;
  faults_.hi = hi;
  faults_.reads = true;
  BucketStepResult r = StepGroups(*opt_, *state_io_, versions_, 2, 1.0f, groups);
  faults_.reads = false;
  ExpectRefused(r, TM_ERR_IO, "group 1, bucket 1");
  ExpectUntouched();
  r = StepGroups(*opt_, *state_io_, versions_, 2, 1.0f, groups);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.buckets_done, kBuckets);
  StepHost(0, 1);
  StepHost(1, 1);
  const AdamHyper own = opt_->hyper();
  ASSERT_TRUE(opt_->SetHyper(other).ok());
  StepHost(2, 4);
  StepHost(3, 4);
  ASSERT_TRUE(opt_->SetHyper(own).ok());
  for (size_t b = 0; b < kBuckets; ++b) {
    EXPECT_TRUE(Matches(b)) << "bucket " << b << ", stepped with its group's hyperparameters";
    EXPECT_EQ(out_[b], want_[b]) << "bucket " << b;
  }
  // A group's step of 0 is refused before anything moves, naming the group.
  const std::vector<BucketGroup> bad = {groups[0], {other, 0, specs.data() + 2, 2}};
  r = StepGroups(*opt_, *state_io_, versions_, 2, 1.0f, bad);
  EXPECT_EQ(ToTmStatus(r.status), TM_ERR_INVALID_ARGUMENT) << r.status;
  EXPECT_NE(r.status.message().find("group 1: step = 0"), absl::string_view::npos) << r.status;
  for (size_t b = 0; b < kBuckets; ++b) EXPECT_TRUE(Matches(b)) << b;
}

// The commit's swap: all pairs or none, refused while a tensor is acquired or sizes differ.
TEST_F(Buckets, SwapContentsIsAllOrNone) {
  Place(0, TM_TIER_NVME);
  Place(1, TM_TIER_DRAM);
  auto other = rt_->CreateTensor({12 * counts_[0], TM_CLASS_OPTIMIZER_STATE, TM_TIER_NVME, "o"});
  ASSERT_TRUE(other.ok());
  std::vector<float> zeros(3 * counts_[0], 0.0f);
  ASSERT_TRUE(rt_->Write(*other, 0, zeros.data(), zeros.size() * 4).ok());
  auto bad = rt_->SwapContents({{tensors_[0], *other}, {tensors_[1], tensors_[2]}});
  EXPECT_EQ(ToTmStatus(bad), TM_ERR_INVALID_ARGUMENT) << bad;
  EXPECT_NE(bad.message().find("sizes differ"), absl::string_view::npos) << bad;
  EXPECT_TRUE(Matches(0)) << "nothing swapped";
  ASSERT_TRUE(rt_->Acquire(*other, TM_TIER_DRAM, TM_ACCESS_READ, nullptr).ok());
  EXPECT_EQ(ToTmStatus(rt_->SwapContents({{tensors_[0], *other}})), TM_ERR_BUSY);
  ASSERT_TRUE(rt_->Release(*other, TM_TIER_DRAM).ok());
  EXPECT_TRUE(Matches(0)) << "nothing swapped";
  // A tensor whose bytes a recompute callback owns does not swap them away.
  const tm_recompute_fn never = [](void*, tm_tensor, tm_tier, void*, uint64_t, void*) {
    return TM_ERR_INTERNAL;
  };
  ASSERT_TRUE(rt_->SetRecompute(*other, never, nullptr, 1.0).ok());
  auto owned = rt_->SwapContents({{tensors_[0], *other}});
  EXPECT_EQ(ToTmStatus(owned), TM_ERR_INVALID_ARGUMENT) << owned;
  EXPECT_NE(owned.message().find("recompute callback"), absl::string_view::npos) << owned;
  ASSERT_TRUE(rt_->SetRecompute(*other, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(Matches(0)) << "nothing swapped";
  ASSERT_TRUE(rt_->SwapContents({{tensors_[0], *other}}).ok());
  std::vector<float> back(zeros.size());
  ASSERT_TRUE(rt_->Read(tensors_[0], 0, back.data(), back.size() * 4).ok());
  EXPECT_EQ(back, zeros) << "the swapped-in bytes";
  ASSERT_TRUE(rt_->Read(*other, 0, back.data(), back.size() * 4).ok());
  EXPECT_EQ(std::memcmp(back.data(), host_[0].data(), back.size() * 4), 0) << "and the old ones";
  ASSERT_TRUE(rt_->DestroyTensor(*other).ok());
}

TEST_F(Buckets, TooSmallStateIsRefusedBeforeAnythingMoves) {
  auto specs = Specs();
  specs[3].count += 1;
  BucketStepResult r = Step(1, 2, specs.data(), specs.size());
  EXPECT_EQ(ToTmStatus(r.status), TM_ERR_INVALID_ARGUMENT) << r.status;
  EXPECT_NE(r.status.message().find("bucket 3"), absl::string_view::npos) << r.status;
  EXPECT_EQ(r.buckets_done, 0u);
  specs = Specs();
  specs[2].state = specs[0].state;  // the same state twice
  specs[2].count = specs[0].count;
  r = Step(1, 2, specs.data(), specs.size());
  EXPECT_EQ(ToTmStatus(r.status), TM_ERR_INVALID_ARGUMENT) << r.status;
  EXPECT_NE(r.status.message().find("bucket 2: its state is bucket 0's too"),
            absl::string_view::npos)
      << r.status;
  for (size_t b = 0; b < kBuckets; ++b) EXPECT_TRUE(Matches(b)) << b;
}

}  // namespace
}  // namespace tiermem::optim
