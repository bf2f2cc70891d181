#include "lib/optim/bucket_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem::optim {

namespace {

absl::Status InBucket(const absl::Status& s, const std::string& bucket, const char* doing) {
  return WithContext(s, absl::StrFormat("%s: %s", bucket, doing));
}

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
  Step(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions, float grad_scale,
       const std::vector<BucketGroup>& groups)
      : opt_(opt),
        tensors_(tensors),
        versions_(versions),
        grad_scale_(grad_scale),
        groups_(groups) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].buckets == nullptr) continue;  // with a count: refused by Check
      for (size_t i = 0; i < groups[g].count; ++i) {
        buckets_.push_back(groups[g].buckets[i]);
        group_of_.push_back(g);
      }
    }
    count_ = buckets_.size();
    on_nvme_.assign(count_, false);
  }
  ~Step() {
    ReleasePinned();
    for (uint64_t t : held_) tensors_.Unhold(t);
  }

  absl::Status Check();
  absl::Status PinDramState();
  absl::Status StepNvmeState(int prefetch_depth);
  absl::Status Commit();
  // The step is prepared and waits: every state it holds refuses this thread's writes too.
  void Seal() {
    for (uint64_t t : held_) tensors_.Seal(t);
  }
  // After a failure: waits for the moves still queued, forgets this step's shadows (their new
  // versions are worthless; the old state was never touched).
  void Discard();
  size_t count() const { return count_; }

 private:
  // "bucket 3", or "group 1, bucket 3" (its index in its group) when there are several groups.
  std::string Name(size_t k) const;
  const BucketGroup& GroupOf(size_t k) const { return groups_[group_of_[k]]; }
  absl::StatusOr<uint64_t> ShadowOf(size_t k);
  absl::Status StepIntoShadow(size_t k, char* staged);
  uint64_t WindowLimit();
  absl::Status Drain(size_t j, size_t* synced);
  void Written(size_t j);
  absl::Status NeedsMoreRoom(const absl::Status& failed, size_t j);
  void ReleasePinned();

  AdamOptimizer& opt_;
  StateTensors& tensors_;
  StepVersions& versions_;
  const float grad_scale_;
  const std::vector<BucketGroup>& groups_;
  std::vector<tm_adam_bucket> buckets_;  // every group's, in order
  std::vector<size_t> group_of_;         // by bucket
  size_t count_ = 0;
  std::vector<bool> on_nvme_;
  std::vector<AdamSpan> dram_spans_;  // DRAM state, acquired for writing, stepped at commit
  std::vector<size_t> dram_group_;    // by position in dram_spans_: its group
  std::vector<uint64_t> pinned_;
  std::vector<uint64_t> held_;         // states held for the step (StateTensors::Hold)
  std::vector<size_t> nvme_;           // buckets stepped into shadows, in order
  std::vector<size_t> staged_at_;      // by position in nvme_: offset in versions_.staged_out
  std::vector<uint64_t> state_bytes_;  // by position in nvme_: its state tensor's size
  uint64_t dram_pinned_bytes_ = 0;     // DRAM state pinned for the commit
  bool streaming_ = false;  // the NVMe state is more than the DRAM window: none kept there
  std::vector<std::pair<uint64_t, uint64_t>> swaps_;  // (state, shadow) written
  size_t prefetched_ = 0;  // positions of nvme_ whose prefetch was asked for
};

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
  size_t staged = 0;
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
      staged += OutBytes(buckets_[i]);
    }
  }
  if (versions_.staged_out.size() < staged) versions_.staged_out.resize(staged);
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
  if (!shadow.ok()) return InBucket(shadow.status(), Name(k), "creating its shadow state");
  // Waits for the bucket's prefetch and takes its failure, if any: the acquire reads again,
  // and reports the failure if it persists.
  (void)tensors_.Sync(t);
  auto src = tensors_.Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ);
  if (!src.ok()) return InBucket(src.status(), Name(k), "reading its state into DRAM");
  auto dst = tensors_.Acquire(*shadow, TM_TIER_DRAM, TM_ACCESS_WRITE);
  if (!dst.ok()) {
    (void)tensors_.Release(t, TM_TIER_DRAM);
    return InBucket(dst.status(), Name(k), "making room for its new state in DRAM");
  }
  const BucketGroup& group = GroupOf(k);
  AdamSpan span = SpanOver(buckets_[k], *dst, group.hyper.amsgrad);
  span.src = static_cast<const float*>(*src);
  if (span.out != nullptr) span.out = staged;
  absl::Status stepped = opt_.StepWith(group.hyper, group.step, grad_scale_, &span, 1);
  absl::Status released = tensors_.Release(*shadow, TM_TIER_DRAM);
  absl::Status released_src = tensors_.Release(t, TM_TIER_DRAM);
  if (!stepped.ok()) return InBucket(stepped, Name(k), "step");  // checked first: only a bug
  if (!released.ok()) return InBucket(released, Name(k), "release");
  if (!released_src.ok()) return InBucket(released_src, Name(k), "release");
  // The old version's DRAM copy is spent (NVMe holds its bytes): dropped now, before the next
  // prefetch needs its room. Left to eviction, it would outlive the buckets read ahead, which
  // were touched less recently, and those would be dropped instead and read twice. (An offload
  // would not do: inclusive DRAM keeps a clean copy while there is room.) A failure is no
  // failure of the step.
  (void)tensors_.DropClean(t);
  // Returns at once: the write runs while the next bucket steps.
  if (absl::Status s = tensors_.Offload(*shadow, TM_TIER_NVME); !s.ok()) {
    return InBucket(s, Name(k), "writing its new state to NVMe");
  }
  swaps_.emplace_back(t, *shadow);
  return absl::OkStatus();
}

// The step's footprint in DRAM is kept under a share of the DRAM tier's budget (what the DRAM
// state stepped in place leaves of it): the bucket stepping (its state and its new version), the
// states read ahead, and the new versions still being written. The rest is left to other
// tensors and to the holes between pinned copies: a copy needs one hole of its size.
uint64_t Step::WindowLimit() {
  auto capacity = tensors_.DramCapacity();
  if (!capacity.ok()) return UINT64_MAX;  // unknown: the prefetch depth alone bounds it
  const uint64_t free = *capacity > dram_pinned_bytes_ ? *capacity - dram_pinned_bytes_ : 0;
  return free / 2;
}

absl::Status Step::NeedsMoreRoom(const absl::Status& failed, size_t j) {
  const uint64_t b = state_bytes_[j];
  auto capacity = tensors_.DramCapacity();
  return Error(
      ToTmStatus(failed),
      absl::StrFormat("%s (%s: this bucket needs %s of DRAM at once, its state and its new "
                      "version, each in one piece%s; the step waited for every copy it had "
                      "in flight and went on serially, and still found no room: give the DRAM "
                      "tier more, or split the bucket's state in smaller buckets (tiermem.torch's "
                      "optimizers step big tensors in slices))",
                      failed.message(), Name(nvme_[j]), HumanBytes(2 * b),
                      capacity.ok()
                          ? absl::StrFormat("; the DRAM tier holds %s, %s of it pinned "
                                            "by state stepped in place",
                                            HumanBytes(*capacity), HumanBytes(dram_pinned_bytes_))
                          : ""));
}

// Waits for every copy the pipeline has in flight and lets go of the states read ahead, so
// that the bucket stepping has the DRAM to itself (but for other tensors' pinned copies).
absl::Status Step::Drain(size_t j, size_t* synced) {
  for (; *synced < j; ++*synced) {
    if (absl::Status s = tensors_.Sync(swaps_[*synced].second); !s.ok()) {
      return InBucket(s, Name(nvme_[*synced]), "writing its new state to NVMe");
    }
    Written(*synced);
  }
  for (size_t k = j + 1; k < prefetched_ && k < nvme_.size(); ++k) {
    const uint64_t t = buckets_[nvme_[k]].state.bits;
    (void)tensors_.Sync(t);  // a failed read shows again at the bucket's acquire
    (void)tensors_.DropClean(t);
  }
  prefetched_ = j + 1;
  return absl::OkStatus();
}

// A new version known written. State that DRAM cannot keep from one step to the next streams
// through it: the clean copy the write leaves in DRAM (inclusive DRAM keeps one) is then only in
// the way. Left to eviction, it would outlive the states read ahead, which were touched less
// recently, and those would be dropped instead and read twice.
void Step::Written(size_t j) {
  if (!streaming_) return;
  (void)tensors_.DropClean(swaps_[j].second);
}

absl::Status Step::StepNvmeState(int prefetch_depth) {
  size_t depth = static_cast<size_t>(std::max(0, prefetch_depth));
  const uint64_t limit = WindowLimit();
  absl::Status status;
  // New versions being written, at most: as many as the buckets read ahead, and one more, and
  // fewer where the window would pass its limit. The disk is the bottleneck here, so the step
  // waits for the oldest write rather than let new versions pile up in DRAM: a demand for room
  // drops clean copies before it waits for writes, and the clean copies in DRAM are the
  // buckets read ahead, which would be read again.
  size_t synced = 0;     // positions of nvme_ whose new version is known written
  uint64_t writing = 0;  // bytes of new versions written behind, not yet waited for
  uint64_t ahead = 0;    // bytes of states read ahead
  uint64_t total = 0;
  for (uint64_t b : state_bytes_) total += b;
  streaming_ = total > limit;
  for (size_t j = 0; j < nvme_.size() && status.ok(); ++j) {
    const uint64_t here = 2 * state_bytes_[j];
    if (j < prefetched_ && j > 0) ahead -= std::min(ahead, state_bytes_[j]);
    while (synced < j && (j - synced > depth || writing + ahead + here > limit)) {
      absl::Status s = tensors_.Sync(swaps_[synced].second);
      if (!s.ok()) {
        status = InBucket(s, Name(nvme_[synced]), "writing its new state to NVMe");
        break;
      }
      Written(synced);
      writing -= state_bytes_[synced++];
    }
    if (!status.ok()) break;
    const size_t want = std::min(nvme_.size(), j + 1 + depth);
    for (prefetched_ = std::max(prefetched_, j + 1); prefetched_ < want; ++prefetched_) {
      if (writing + ahead + here + state_bytes_[prefetched_] > limit) break;
      // A hint: a failed read shows again at the bucket's acquire, which reports it.
      (void)tensors_.Prefetch(buckets_[nvme_[prefetched_]].state.bits, TM_TIER_DRAM);
      ahead += state_bytes_[prefetched_];
    }
    char* staged = versions_.staged_out.data() + staged_at_[j];
    status = StepIntoShadow(nvme_[j], staged);
    if (ToTmStatus(status) == TM_ERR_OUT_OF_MEMORY) {
      // No room beside the copies in flight: wait for them all, and go on serially.
      if (absl::Status s = Drain(j, &synced); !s.ok()) {
        status = s;
        break;
      }
      writing = ahead = 0;
      depth = 0;
      status = StepIntoShadow(nvme_[j], staged);
      if (ToTmStatus(status) == TM_ERR_OUT_OF_MEMORY) status = NeedsMoreRoom(status, j);
    }
    if (status.ok()) writing += state_bytes_[j];
  }
  // Every new version is on NVMe before any is swapped in.
  for (size_t j = synced; j < swaps_.size(); ++j) {
    absl::Status s = tensors_.Sync(swaps_[j].second);
    if (!s.ok() && status.ok()) {
      status = InBucket(s, Name(nvme_[j]), "writing its new state to NVMe");
    }
    if (s.ok()) Written(j);
  }
  return status;
}

absl::Status Step::Commit() {
  if (absl::Status s = tensors_.SwapContents(swaps_); !s.ok()) {
    return WithContext(s, "swapping in the new state");
  }
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
  return StepGroups(opt, tensors, versions, prefetch_depth, grad_scale,
                    {BucketGroup{opt.hyper(), step, buckets, count}});
}

namespace {

absl::Status NotTaken(const absl::Status& s) {
  return Error(ToTmStatus(s), absl::StrCat(s.message(),
                                           " (the step was not taken: every state and parameter "
                                           "is as before)"));
}

// The Step over groups of its own (the caller's vector may go before the commit).
class Prepared : public PreparedStep {
 public:
  Prepared(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions, float grad_scale,
           std::vector<BucketGroup> groups)
      : groups_(std::move(groups)), step_(opt, tensors, versions, grad_scale, groups_) {}
  ~Prepared() override { Abort(); }

  absl::Status Prepare(int prefetch_depth) {
    absl::Status s = step_.Check();
    if (s.ok()) s = step_.PinDramState();
    if (s.ok()) s = step_.StepNvmeState(prefetch_depth);
    if (!s.ok()) {
      Abort();
      return NotTaken(s);
    }
    step_.Seal();
    return absl::OkStatus();
  }
  BucketStepResult Commit() override {
    BucketStepResult r;
    if (done_) {
      r.status = Error(TM_ERR_INVALID_ARGUMENT, "the prepared step was taken or aborted already");
      return r;
    }
    r.status = step_.Commit();
    if (!r.status.ok()) {
      Abort();
      r.status = NotTaken(r.status);
      return r;
    }
    done_ = true;
    r.buckets_done = step_.count();
    return r;
  }
  void Abort() override {
    if (done_) return;
    done_ = true;
    step_.Discard();
  }

 private:
  const std::vector<BucketGroup> groups_;  // before step_, which refers to it
  Step step_;
  bool done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedStep>> PrepareGroups(AdamOptimizer& opt,
                                                            StateTensors& tensors,
                                                            StepVersions& versions,
                                                            int prefetch_depth, float grad_scale,
                                                            std::vector<BucketGroup> groups) {
  auto p = std::make_unique<Prepared>(opt, tensors, versions, grad_scale, std::move(groups));
  if (absl::Status s = p->Prepare(prefetch_depth); !s.ok()) return s;
  return std::unique_ptr<PreparedStep>(std::move(p));
}

BucketStepResult StepGroups(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions,
                            int prefetch_depth, float grad_scale,
                            const std::vector<BucketGroup>& groups) {
  auto prepared = PrepareGroups(opt, tensors, versions, prefetch_depth, grad_scale, groups);
  if (!prepared.ok()) return BucketStepResult{prepared.status(), 0};
  return (*prepared)->Commit();
}

}  // namespace tiermem::optim
