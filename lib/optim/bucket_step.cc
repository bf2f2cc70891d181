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
