// The CPU Adam's step over state tensors (bucket_step.h), as one class: the buckets checked and
// held, the DRAM state pinned, the NVMe state streamed through DRAM into shadow versions
// (step_stream.cc), then committed or undone (step.cc). Internal to lib/optim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/bucket_step.h"
#include "tiermem/tiermem.h"

namespace tiermem::optim::internal {

// `s` with "<bucket>: <doing>" before its message.
absl::Status InBucket(const absl::Status& s, const std::string& bucket, const char* doing);
// The span of a bucket whose state (master | m | v | max_v) is at `state`.
AdamSpan SpanOver(const tm_adam_bucket& b, void* state, bool amsgrad);
// The bytes of its updated parameters in their output dtype (0 without param_out).
size_t OutBytes(const tm_adam_bucket& b);

// One step's work: the buckets, where each state is, and what has been acquired, created and
// queued so far, to be committed or undone.
class Step {
 public:
  // `staged_base`: where this step's updated parameters start in versions.staged_out, and
  // `pinned_before` the DRAM state pinned by the parts of the same step prepared before it (a
  // step prepared in parts: PreparedStep::Extend).
  Step(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions, float grad_scale,
       const std::vector<BucketGroup>& groups, size_t staged_base = 0, uint64_t pinned_before = 0,
       bool out_now = false)
      : opt_(opt),
        tensors_(tensors),
        versions_(versions),
        grad_scale_(grad_scale),
        groups_(groups),
        staged_base_(staged_base),
        out_now_(out_now),
        dram_pinned_bytes_(pinned_before) {
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
  // Commit in two halves, for a step prepared in parts: every part's swaps exchanged in one
  // SwapContents (all or none), then each part's Finish, which cannot fail but for a bug.
  const std::vector<std::pair<uint64_t, uint64_t>>& swaps() const { return swaps_; }
  absl::Status Finish();
  // Where the next part's updated parameters start in versions.staged_out, and the DRAM state
  // pinned so far (this part's and the parts' before it).
  size_t staged_end() const { return staged_end_; }
  // The NVMe state of the parts before this one, and with this one's: a step in parts streams
  // (drops the clean copies its writes leave) once all its parts' state passes the window.
  void set_state_before(uint64_t bytes) { state_before_ = bytes; }
  uint64_t state_end() const { return state_end_; }
  uint64_t pinned_bytes() const { return dram_pinned_bytes_; }
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
  const size_t staged_base_;
  // NVMe buckets write param_out as they step, not at the commit (TM_ADAM_OUT_SCRATCH: the
  // caller's buffers are not the live parameters); nothing of them is staged.
  const bool out_now_;
  size_t staged_end_ = 0;
  uint64_t dram_pinned_bytes_ = 0;  // DRAM state pinned for the commit (and by earlier parts)
  bool streaming_ = false;          // the NVMe state is more than the DRAM window: none kept there
  uint64_t state_before_ = 0;
  uint64_t state_end_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> swaps_;  // (state, shadow) written
  size_t prefetched_ = 0;  // positions of nvme_ whose prefetch was asked for
};

}  // namespace tiermem::optim::internal
