#include "lib/optim/bucket_step.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem::optim {

namespace {

absl::Status InBucket(const absl::Status& s, size_t bucket, const char* doing) {
  return WithContext(s, absl::StrFormat("bucket %zu: %s", bucket, doing));
}

absl::Status CheckBucket(StateTensors& tensors, const tm_adam_bucket& b, size_t index,
                         bool amsgrad) {
  auto bad = [index](const std::string& what) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("bucket %zu: %s", index, what));
  };
  if (b.count == 0) return absl::OkStatus();
  if (b.grad == nullptr) return bad("grad is NULL");
  if (b.grad_dtype < TM_DTYPE_F32 || b.grad_dtype >= TM_DTYPE_COUNT) {
    return bad("grad_dtype is not a tm_dtype");
  }
  if (b.param_out != nullptr &&
      (b.param_out_dtype < TM_DTYPE_F32 || b.param_out_dtype >= TM_DTYPE_COUNT)) {
    return bad("param_out_dtype is not a tm_dtype");
  }
  const uint64_t per = amsgrad ? 16 : 12;
  if (b.count > UINT64_MAX / per) return bad("count is too large");
  auto bytes = tensors.Bytes(b.state.bits);
  if (!bytes.ok()) return InBucket(bytes.status(), index, "state");
  if (*bytes < b.count * per) {
    return bad(absl::StrFormat("state holds %u bytes, %u needed for count %u%s", *bytes,
                               b.count * per, b.count, amsgrad ? " with amsgrad" : ""));
  }
  return absl::OkStatus();
}

AdamSpan SpanOver(const tm_adam_bucket& b, void* state, bool amsgrad) {
  float* base = static_cast<float*>(state);
  const size_t n = b.count;
  AdamSpan s;
  s.param = base;
  s.m = base + n;
  s.v = base + 2 * n;
  s.max_v = amsgrad ? base + 3 * n : nullptr;
  s.grad = b.grad;
  s.grad_type = static_cast<Dtype>(b.grad_dtype);
  s.out = b.param_out;
  s.out_type = static_cast<Dtype>(b.param_out_dtype);
  s.n = n;
  return s;
}

size_t OutBytes(const tm_adam_bucket& b) {
  if (b.param_out == nullptr) return 0;
  return b.count * (b.param_out_dtype == TM_DTYPE_F32 ? 4 : 2);
}

// One step's work: the buckets, where each state is, and what has been acquired, created and
// queued so far, to be committed or undone.
class Step {
 public:
  Step(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions, uint64_t step,
       float grad_scale, const tm_adam_bucket* buckets, size_t count)
      : opt_(opt),
        tensors_(tensors),
        versions_(versions),
        step_(step),
        grad_scale_(grad_scale),
        buckets_(buckets),
        count_(count),
        on_nvme_(count, false) {}
  ~Step() { ReleasePinned(); }

  absl::Status Check();
  absl::Status PinDramState();
  absl::Status StepNvmeState(int prefetch_depth);
  absl::Status Commit();
  // After a failure: waits for the moves still queued, forgets this step's shadows (their new
  // versions are worthless; the old state was never touched).
  void Discard();

 private:
  absl::StatusOr<uint64_t> ShadowOf(size_t k);
  absl::Status StepIntoShadow(size_t k, char* staged);
  void ReleasePinned();

  AdamOptimizer& opt_;
  StateTensors& tensors_;
  StepVersions& versions_;
  const uint64_t step_;
  const float grad_scale_;
  const tm_adam_bucket* buckets_;
  const size_t count_;
  std::vector<bool> on_nvme_;
  std::vector<AdamSpan> dram_spans_;  // DRAM state, acquired for writing, stepped at commit
  std::vector<uint64_t> pinned_;
  std::vector<size_t> nvme_;       // buckets stepped into shadows, in order
  std::vector<size_t> staged_at_;  // by position in nvme_: offset in versions_.staged_out
  std::vector<std::pair<uint64_t, uint64_t>> swaps_;  // (state, shadow) written
  size_t prefetched_ = 0;  // positions of nvme_ whose prefetch was asked for
};

absl::Status Step::Check() {
  versions_.ForgetOrphans(tensors_);
  const bool amsgrad = opt_.hyper().amsgrad;
  size_t staged = 0;
  absl::flat_hash_map<uint64_t, size_t> seen;  // state tensor -> its bucket
  for (size_t i = 0; i < count_; ++i) {
    if (absl::Status s = CheckBucket(tensors_, buckets_[i], i, amsgrad); !s.ok()) return s;
    if (buckets_[i].count == 0) continue;
    // One version per state and step: a state in two buckets would be swapped twice.
    if (auto [it, fresh] = seen.emplace(buckets_[i].state.bits, i); !fresh) {
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrFormat("bucket %zu: its state is bucket %zu's too", i, it->second));
    }
    auto mask = tensors_.Residency(buckets_[i].state.bits);
    if (!mask.ok()) return InBucket(mask.status(), i, "state");
    // State with an NVMe copy lives on NVMe (a DRAM copy beside it is a clean copy: inclusive
    // DRAM, or a prefetch) and is stepped into a shadow; state only in DRAM (or HBM) is stepped
    // in place in DRAM at commit.
    on_nvme_[i] = (*mask & TM_TIER_BIT(TM_TIER_NVME)) != 0;
    if (on_nvme_[i]) {
      nvme_.push_back(i);
      staged_at_.push_back(staged);
      staged += OutBytes(buckets_[i]);
    }
  }
  if (versions_.staged_out.size() < staged) versions_.staged_out.resize(staged);
  return absl::OkStatus();
}

absl::Status Step::PinDramState() {
  const bool amsgrad = opt_.hyper().amsgrad;
  for (size_t i = 0; i < count_; ++i) {
    if (on_nvme_[i] || buckets_[i].count == 0) continue;
    const uint64_t t = buckets_[i].state.bits;
    auto state = tensors_.Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ_WRITE);
    if (!state.ok()) return InBucket(state.status(), i, "acquiring its state in DRAM");
    pinned_.push_back(t);
    dram_spans_.push_back(SpanOver(buckets_[i], *state, amsgrad));
    if (absl::Status s = ValidateSpan(dram_spans_.back(), i, amsgrad); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Step::ReleasePinned() {
  for (uint64_t t : pinned_) (void)tensors_.Release(t, TM_TIER_DRAM);
  pinned_.clear();
}

absl::StatusOr<uint64_t> Step::ShadowOf(size_t k) {
  const uint64_t t = buckets_[k].state.bits;
  if (auto it = versions_.shadow_of.find(t); it != versions_.shadow_of.end()) return it->second;
  auto bytes = tensors_.Bytes(t);
  if (!bytes.ok()) return bytes.status();
  auto shadow = tensors_.Create(*bytes, absl::StrFormat("cpu_adam shadow %016x", t));
  if (!shadow.ok()) return shadow.status();
  versions_.shadow_of[t] = *shadow;
  return *shadow;
}

// Reads bucket k's state (in DRAM, read-only), steps it into its shadow's DRAM copy and queues
// the shadow's write to NVMe; the updated parameter goes to `staged`.
absl::Status Step::StepIntoShadow(size_t k, char* staged) {
  const uint64_t t = buckets_[k].state.bits;
  auto shadow = ShadowOf(k);
  if (!shadow.ok()) return InBucket(shadow.status(), k, "creating its shadow state");
  // Waits for the bucket's prefetch and takes its failure, if any: the acquire reads again,
  // and reports the failure if it persists.
  (void)tensors_.Sync(t);
  auto src = tensors_.Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ);
  if (!src.ok()) return InBucket(src.status(), k, "reading its state into DRAM");
  auto dst = tensors_.Acquire(*shadow, TM_TIER_DRAM, TM_ACCESS_WRITE);
  if (!dst.ok()) {
    (void)tensors_.Release(t, TM_TIER_DRAM);
    return InBucket(dst.status(), k, "making room for its new state in DRAM");
  }
  AdamSpan span = SpanOver(buckets_[k], *dst, opt_.hyper().amsgrad);
  span.src = static_cast<const float*>(*src);
  if (span.out != nullptr) span.out = staged;
  absl::Status stepped = opt_.Step(step_, grad_scale_, &span, 1);
  absl::Status released = tensors_.Release(*shadow, TM_TIER_DRAM);
  absl::Status released_src = tensors_.Release(t, TM_TIER_DRAM);
  if (!stepped.ok()) return InBucket(stepped, k, "step");  // checked first: only a bug
  if (!released.ok()) return InBucket(released, k, "release");
  if (!released_src.ok()) return InBucket(released_src, k, "release");
  // The old version's DRAM copy is spent (NVMe holds its bytes): dropped now, before the next
  // prefetch needs its room. Left to eviction, it would outlive the buckets read ahead, which
  // were touched less recently, and those would be dropped instead and read twice. The offload
  // only frees the copy; the sync waits for that (a failure is no failure of the step).
  (void)tensors_.Offload(t, TM_TIER_NVME);
  (void)tensors_.Sync(t);
  // Returns at once: the write runs while the next bucket steps.
  if (absl::Status s = tensors_.Offload(*shadow, TM_TIER_NVME); !s.ok()) {
    return InBucket(s, k, "writing its new state to NVMe");
  }
  swaps_.emplace_back(t, *shadow);
  return absl::OkStatus();
}

absl::Status Step::StepNvmeState(int prefetch_depth) {
  const size_t depth = static_cast<size_t>(std::max(0, prefetch_depth));
  absl::Status status;
  // New versions being written, at most: as many as the buckets read ahead, and one more.
  // The disk is the bottleneck here, so the step waits for the oldest write rather than let
  // new versions pile up in DRAM: a demand for room drops clean copies before it waits for
  // writes, and the clean copies in DRAM are the buckets read ahead, which would be read again.
  // In DRAM at once: the bucket stepping and its new version, the depth read ahead, and the
  // writes behind: 2 + 2 * depth buckets.
  const size_t writing = depth + 1;
  for (size_t j = 0; j < nvme_.size() && status.ok(); ++j) {
    if (j >= writing) {
      absl::Status s = tensors_.Sync(swaps_[j - writing].second);
      if (!s.ok()) {
        status = InBucket(s, nvme_[j - writing], "writing its new state to NVMe");
        break;
      }
    }
    const size_t want = std::min(nvme_.size(), j + 1 + depth);
    for (prefetched_ = std::max(prefetched_, j + 1); prefetched_ < want; ++prefetched_) {
      // A hint: a failed read shows again at the bucket's acquire, which reports it.
      (void)tensors_.Prefetch(buckets_[nvme_[prefetched_]].state.bits, TM_TIER_DRAM);
    }
    status = StepIntoShadow(nvme_[j], versions_.staged_out.data() + staged_at_[j]);
  }
  // Every new version is on NVMe before any is swapped in.
  for (size_t j = 0; j < swaps_.size(); ++j) {
    absl::Status s = tensors_.Sync(swaps_[j].second);
    if (!s.ok() && status.ok()) status = InBucket(s, nvme_[j], "writing its new state to NVMe");
  }
  return status;
}

absl::Status Step::Commit() {
  if (absl::Status s = tensors_.SwapContents(swaps_); !s.ok()) {
    return WithContext(s, "swapping in the new state");
  }
  // From here nothing can fail: the DRAM spans were checked and are pinned.
  if (!dram_spans_.empty()) {
    absl::Status s = opt_.Step(step_, grad_scale_, dram_spans_.data(), dram_spans_.size());
    if (!s.ok()) return s;
  }
  for (size_t j = 0; j < nvme_.size(); ++j) {
    const tm_adam_bucket& b = buckets_[nvme_[j]];
    if (b.param_out != nullptr) {
      std::memcpy(b.param_out, versions_.staged_out.data() + staged_at_[j], OutBytes(b));
    }
  }
  ReleasePinned();
  return absl::OkStatus();
}

void Step::Discard() {
  // Prefetches past a failure are waited for, so that none is left to surprise a later sync.
  for (size_t j = 0; j < prefetched_ && j < nvme_.size(); ++j) {
    (void)tensors_.Sync(buckets_[nvme_[j]].state.bits);
  }
  for (const auto& [state, shadow] : swaps_) {
    (void)tensors_.Sync(shadow);
    (void)tensors_.Destroy(shadow);
    versions_.shadow_of.erase(state);
  }
  ReleasePinned();
}

}  // namespace

void StepVersions::ForgetOrphans(StateTensors& tensors) {
  std::vector<uint64_t> gone;
  for (const auto& [state, shadow] : shadow_of) {
    if (ToTmStatus(tensors.Bytes(state).status()) == TM_ERR_INVALID_HANDLE) gone.push_back(state);
  }
  for (uint64_t state : gone) {
    (void)tensors.Destroy(shadow_of[state]);
    shadow_of.erase(state);
  }
}

void StepVersions::Forget(StateTensors& tensors) {
  for (const auto& [state, shadow] : shadow_of) (void)tensors.Destroy(shadow);
  shadow_of.clear();
}

BucketStepResult StepBuckets(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions,
                             int prefetch_depth, uint64_t step, float grad_scale,
                             const tm_adam_bucket* buckets, size_t count) {
  BucketStepResult r;
  Step s(opt, tensors, versions, step, grad_scale, buckets, count);
  // Everything is checked, and where each state is, before anything moves.
  if (r.status = s.Check(); !r.status.ok()) return r;
  r.status = s.PinDramState();
  if (r.status.ok()) r.status = s.StepNvmeState(prefetch_depth);
  if (r.status.ok()) r.status = s.Commit();
  if (!r.status.ok()) {
    s.Discard();
    r.status = Error(ToTmStatus(r.status),
                     absl::StrCat(r.status.message(),
                                  " (the step was not taken: every state and parameter is as "
                                  "before)"));
    return r;
  }
  r.buckets_done = count;
  return r;
}

}  // namespace tiermem::optim
