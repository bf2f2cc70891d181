// The step's phases but the NVMe stream (step_stream.cc): the checks and holds, the DRAM state
// pinned, the commit, the undo.
#include "lib/optim/step.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem::optim::internal {

absl::Status InBucket(const absl::Status& s, const std::string& bucket, const char* doing) {
  return WithContext(s, absl::StrFormat("%s: %s", bucket, doing));
}

namespace {

// `name()`: the bucket's name for errors, made only when there is one.
template <typename NameFn>
absl::Status CheckBucket(StateTensors& tensors, const tm_adam_bucket& b, NameFn name,
                         bool amsgrad) {
  auto bad = [&name](const std::string& what) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: %s", name(), what));
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
  if (!bytes.ok()) return InBucket(bytes.status(), name(), "state");
  if (*bytes < b.count * per) {
    return bad(absl::StrFormat("state holds %u bytes, %u needed for count %u%s", *bytes,
                               b.count * per, b.count, amsgrad ? " with amsgrad" : ""));
  }
  return absl::OkStatus();
}

}  // namespace

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

std::string Step::Name(size_t k) const {
  if (groups_.size() == 1) return absl::StrFormat("bucket %zu", k);
  size_t first = k;  // errors only: the walk back is no cost
  while (first > 0 && group_of_[first - 1] == group_of_[k]) --first;
  return absl::StrFormat("group %zu, bucket %zu", group_of_[k], k - first);
}

absl::Status Step::Check() {
  versions_.ForgetOrphans(tensors_);
  // Everything the commit's kernel passes would refuse is refused here, before anything moves.
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string group = groups_.size() == 1 ? "" : absl::StrFormat("group %zu: ", g);
    if (groups_[g].count > 0 && groups_[g].buckets == nullptr) {
      return Error(TM_ERR_INVALID_ARGUMENT, absl::StrCat(group, "buckets is NULL"));
    }
    if (groups_[g].step == 0) {
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrCat(group, "step = 0, want the step number from 1"));
    }
    if (absl::Status s = ValidateHyper(groups_[g].hyper); !s.ok()) {
      return WithContext(s, absl::StrCat(group, "hyperparameters"));
    }
  }
  if (!std::isfinite(grad_scale_) || grad_scale_ < 0.0f) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("grad_scale = %g, want a finite value >= 0", grad_scale_));
  }
  size_t staged = staged_base_;
  absl::flat_hash_map<uint64_t, size_t> seen;  // state tensor -> its bucket
  for (size_t i = 0; i < count_; ++i) {
    auto name = [this, i] { return Name(i); };
    if (absl::Status s = CheckBucket(tensors_, buckets_[i], name, GroupOf(i).hyper.amsgrad);
        !s.ok()) {
      return s;
    }
    if (buckets_[i].count == 0) continue;
    // One version per state and step: a state in two buckets would be swapped twice.
    if (auto [it, fresh] = seen.emplace(buckets_[i].state.bits, i); !fresh) {
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrFormat("%s: its state is %s's too", Name(i), Name(it->second)));
    }
    // A state a caller holds acquired would change under its pointer (DRAM state is stepped in
    // place), or its holder's writes would be lost to the new version: refused before anything
    // moves. (The swap refuses it too, but only after the step's reads and writes.) Held from
    // here to the end of the step: a write by another thread meanwhile is refused, not lost.
    if (absl::Status s = tensors_.Hold(buckets_[i].state.bits); !s.ok()) {
      return InBucket(s, Name(i), "state (release it before the step)");
    }
    held_.push_back(buckets_[i].state.bits);
    auto mask = tensors_.Residency(buckets_[i].state.bits);
    if (!mask.ok()) return InBucket(mask.status(), Name(i), "state");
    // State with an NVMe copy lives on NVMe (a DRAM copy beside it is a clean copy: inclusive
    // DRAM, or a prefetch) and is stepped into a shadow; state only in DRAM (or HBM) is stepped
    // in place in DRAM at commit.
    on_nvme_[i] = (*mask & TM_TIER_BIT(TM_TIER_NVME)) != 0;
    if (on_nvme_[i]) {
      auto bytes = tensors_.Bytes(buckets_[i].state.bits);
      if (!bytes.ok()) return InBucket(bytes.status(), Name(i), "state");
      state_bytes_.push_back(*bytes);
      nvme_.push_back(i);
      staged_at_.push_back(staged);
      if (!out_now_) staged += OutBytes(buckets_[i]);
    }
  }
  if (versions_.staged_out.size() < staged) versions_.staged_out.resize(staged);
  staged_end_ = staged;
  return absl::OkStatus();
}

absl::Status Step::PinDramState() {
  for (size_t i = 0; i < count_; ++i) {
    if (on_nvme_[i] || buckets_[i].count == 0) continue;
    const bool amsgrad = GroupOf(i).hyper.amsgrad;
    const uint64_t t = buckets_[i].state.bits;
    auto state = tensors_.Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ_WRITE);
    if (!state.ok()) return InBucket(state.status(), Name(i), "acquiring its state in DRAM");
    pinned_.push_back(t);
    if (auto bytes = tensors_.Bytes(t); bytes.ok()) dram_pinned_bytes_ += *bytes;
    dram_spans_.push_back(SpanOver(buckets_[i], *state, amsgrad));
    dram_group_.push_back(group_of_[i]);
    if (absl::Status s = ValidateSpan(dram_spans_.back(), i, amsgrad); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Step::ReleasePinned() {
  for (uint64_t t : pinned_) (void)tensors_.Release(t, TM_TIER_DRAM);
  pinned_.clear();
}

absl::Status Step::Commit() {
  if (absl::Status s = tensors_.SwapContents(swaps_); !s.ok()) {
    return WithContext(s, "swapping in the new state");
  }
  return Finish();
}

absl::Status Step::Finish() {
  // From here nothing can fail: the DRAM spans, hyperparameters and steps were checked and the
  // spans are pinned. One pass per group (its own hyperparameters and step number); the spans
  // of a group are consecutive.
  for (size_t a = 0, b = 0; a < dram_spans_.size(); a = b) {
    while (b < dram_spans_.size() && dram_group_[b] == dram_group_[a]) ++b;
    const BucketGroup& group = groups_[dram_group_[a]];
    absl::Status s = opt_.StepWith(group.hyper, group.step, grad_scale_, &dram_spans_[a], b - a);
    if (!s.ok()) return s;
  }
  for (size_t j = 0; j < nvme_.size(); ++j) {
    const tm_adam_bucket& b = buckets_[nvme_[j]];
    if (b.param_out != nullptr && !out_now_) {
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

}  // namespace tiermem::optim::internal
