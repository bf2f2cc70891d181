// The CPU Adam's step over state tensors: its entry points (StepBuckets, StepGroups,
// PrepareGroups) and the shadow versions kept from one step to the next; the step itself is
// step.h's.
#include "lib/optim/bucket_step.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/optim/step.h"

namespace tiermem::optim {

using internal::Step;

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

// One part of a prepared step: its groups (the caller's vector may go before the commit) and
// the Step over them.
struct Part {
  Part(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions, float grad_scale,
       std::vector<BucketGroup> g, size_t staged_base, uint64_t pinned_before, bool out_now)
      : groups(std::move(g)),
        step(opt, tensors, versions, grad_scale, groups, staged_base, pinned_before, out_now) {}
  const std::vector<BucketGroup> groups;  // before step, which refers to it
  Step step;
};

// A step prepared in one part or several (Extend), committed or undone as one.
class Prepared : public PreparedStep {
 public:
  Prepared(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions, int prefetch_depth)
      : opt_(opt), tensors_(tensors), versions_(versions), prefetch_depth_(prefetch_depth) {}
  ~Prepared() override { Abort(); }

  absl::Status Extend(float grad_scale, std::vector<BucketGroup> groups, bool out_now) override {
    if (done_) {
      return Error(TM_ERR_INVALID_ARGUMENT, "the prepared step was taken or aborted already");
    }
    const size_t staged = parts_.empty() ? 0 : parts_.back()->step.staged_end();
    const uint64_t pinned = parts_.empty() ? 0 : parts_.back()->step.pinned_bytes();
    auto part = std::make_unique<Part>(opt_, tensors_, versions_, grad_scale, std::move(groups),
                                       staged, pinned, out_now);
    Step& step = part->step;
    step.set_state_before(parts_.empty() ? 0 : parts_.back()->step.state_end());
    absl::Status s = step.Check();
    if (s.ok()) s = step.PinDramState();
    if (s.ok()) s = step.StepNvmeState(prefetch_depth_);
    if (!s.ok()) {
      step.Discard();  // this part only: the parts before it stay prepared
      return NotTaken(s);
    }
    step.Seal();
    parts_.push_back(std::move(part));
    return absl::OkStatus();
  }
  BucketStepResult Commit() override {
    BucketStepResult r;
    if (done_) {
      r.status = Error(TM_ERR_INVALID_ARGUMENT, "the prepared step was taken or aborted already");
      return r;
    }
    r.status = CommitParts();
    if (!r.status.ok()) {
      Abort();
      r.status = NotTaken(r.status);
      return r;
    }
    done_ = true;
    for (const auto& part : parts_) r.buckets_done += part->step.count();
    return r;
  }
  void Abort() override {
    if (done_) return;
    done_ = true;
    for (auto& part : parts_) part->step.Discard();
  }

 private:
  // Every part's new versions swapped in at once (all or none), then each part's DRAM state
  // stepped and its parameters written out.
  absl::Status CommitParts() {
    if (parts_.size() == 1) return parts_[0]->step.Commit();
    std::vector<std::pair<uint64_t, uint64_t>> swaps;
    for (const auto& part : parts_) {
      swaps.insert(swaps.end(), part->step.swaps().begin(), part->step.swaps().end());
    }
    if (absl::Status s = tensors_.SwapContents(swaps); !s.ok()) {
      return WithContext(s, "swapping in the new state");
    }
    for (auto& part : parts_) {
      if (absl::Status s = part->step.Finish(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  AdamOptimizer& opt_;
  StateTensors& tensors_;
  StepVersions& versions_;
  const int prefetch_depth_;
  std::vector<std::unique_ptr<Part>> parts_;
  bool done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedStep>> PrepareGroups(AdamOptimizer& opt,
                                                            StateTensors& tensors,
                                                            StepVersions& versions,
                                                            int prefetch_depth, float grad_scale,
                                                            std::vector<BucketGroup> groups) {
  auto p = std::make_unique<Prepared>(opt, tensors, versions, prefetch_depth);
  if (absl::Status s = p->Extend(grad_scale, std::move(groups), false); !s.ok()) return s;
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
