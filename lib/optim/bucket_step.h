// The Adam step over state held in tiermem tensors, pipelined by bucket: the state of the
// buckets ahead is prefetched into DRAM while the current one steps, and the new state of those
// on NVMe is written back behind it. The step is all or nothing: NVMe state is stepped into a
// shadow tensor (a new version; the old one stays on NVMe), and only once every new version is
// read, stepped and written are the versions swapped in (Runtime::SwapContents), the DRAM state
// stepped in place and the updated parameters written out. A failure anywhere before leaves
// every state and parameter as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/optim/adam_optimizer.h"
#include "tiermem/tiermem.h"

namespace tiermem::optim {

// The tensor operations the pipeline needs, as the runtime offers them; one implementation goes
// through the C API's handles, another straight to a Runtime
// (lib/api/runtime_state_tensors.h). lib/optim knows the runtime only through this interface.
class StateTensors {
 public:
  virtual ~StateTensors() = default;
  virtual absl::StatusOr<uint64_t> Bytes(uint64_t tensor) = 0;
  virtual absl::StatusOr<uint32_t> Residency(uint64_t tensor) = 0;
  virtual absl::Status Prefetch(uint64_t tensor, tm_tier tier) = 0;
  virtual absl::StatusOr<void*> Acquire(uint64_t tensor, tm_tier tier, tm_access access) = 0;
  virtual absl::Status Release(uint64_t tensor, tm_tier tier) = 0;
  // Holds a state tensor for the step (Runtime::HoldForStep): TM_ERR_BUSY naming the tensor
  // while a caller holds it acquired or another step holds it; until Unhold, other threads'
  // writes to it are refused.
  virtual absl::Status Hold(uint64_t tensor) = 0;
  virtual void Unhold(uint64_t tensor) = 0;
  // The step holding it is prepared and waits (Runtime::SealForStep): from now to Unhold, the
  // calling thread's writes, holds and destroys are refused too.
  virtual void Seal(uint64_t tensor) = 0;
  virtual absl::Status Offload(uint64_t tensor, tm_tier tier) = 0;
  virtual absl::Status Sync(uint64_t tensor) = 0;
  // A tensor of `bytes` homed on NVMe, of class optimizer state (a shadow version).
  virtual absl::StatusOr<uint64_t> Create(uint64_t bytes, const std::string& name) = 0;
  virtual absl::Status Destroy(uint64_t tensor) = 0;
  // All pairs exchange their contents, or none does (Runtime::SwapContents).
  virtual absl::Status SwapContents(const std::vector<std::pair<uint64_t, uint64_t>>& pairs) = 0;
  // Frees the tensor's DRAM copy when NVMe holds the same bytes (Runtime::DropCleanCopy): the
  // step will not read it again, and left to eviction it would outlive copies it still needs.
  virtual absl::Status DropClean(uint64_t tensor) = 0;
  // The DRAM tier's budget in bytes: the pipeline keeps what it has in DRAM at once under it.
  virtual absl::StatusOr<uint64_t> DramCapacity() = 0;
};

// What the pipeline keeps from one step to the next (one per optimizer): each NVMe state's
// shadow tensor (the same size; it costs a second copy of the state on NVMe, never in DRAM),
// and the buffer the updated parameters of NVMe buckets wait in until the step commits (the
// size of those parameters in their output dtype).
struct StepVersions {
  absl::flat_hash_map<uint64_t, uint64_t> shadow_of;  // state tensor -> its shadow
  std::vector<char> staged_out;
  // Destroys every shadow (errors ignored: the runtime may be gone already).
  void Forget(StateTensors& tensors);
  // Destroys the shadows of state tensors destroyed since (each step starts with it).
  void ForgetOrphans(StateTensors& tensors);
};

struct BucketStepResult {
  absl::Status status;
  size_t buckets_done = 0;  // count when the step was taken, 0 when nothing changed
};

// `prefetch_depth`: buckets read ahead of the one stepping (0: none). Error messages name the
// buckets "bucket <index>". The optimizer's hyperparameters.
BucketStepResult StepBuckets(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions,
                             int prefetch_depth, uint64_t step, float grad_scale,
                             const tm_adam_bucket* buckets, size_t count);

// Buckets stepped with their own hyperparameters and step number (a torch parameter group, or
// those of its parameters at one step count).
struct BucketGroup {
  AdamHyper hyper;
  uint64_t step = 1;
  const tm_adam_bucket* buckets = nullptr;
  size_t count = 0;
};

// Every group's buckets in one step, all or nothing across the groups: one failure anywhere
// leaves every group's state and parameters as they were. With more than one group, errors
// name "group <g>, bucket <index in the group>". PrepareGroups, then Commit.
BucketStepResult StepGroups(AdamOptimizer& opt, StateTensors& tensors, StepVersions& versions,
                            int prefetch_depth, float grad_scale,
                            const std::vector<BucketGroup>& groups);

// A step prepared and not yet taken: every NVMe state's new version read, stepped and written
// beside the old one, the DRAM state pinned, every state held (Hold) so that nobody writes it.
// Commit takes it (the versions swapped in, the DRAM state stepped in place, param_out written:
// a swap refused, only a bug, aborts and fails); Abort, or the destructor, leaves every state
// and parameter as it was. Between the two, so that ranks can agree on one outcome, the
// gradients and param_out buffers stay the caller's, unchanged. One call of either, once.
class PreparedStep {
 public:
  virtual ~PreparedStep() = default;
  virtual BucketStepResult Commit() = 0;
  virtual void Abort() = 0;
  // Prepares more buckets into this step (a part; each part's grad_scale its own), committed or
  // aborted with the others: an optimizer stepped piece by piece (a sharded model's units, one
  // in memory at a time) that stays all or nothing. A failure undoes this part only (the
  // parts before stay prepared, for the caller to commit or abort) and says that nothing of
  // it changed. A bucket whose state is on NVMe has read its gradient when this returns; one
  // whose state is in DRAM reads it at the commit.
  // out_now: the NVMe buckets' param_out are the caller's scratch buffers, written as the
  // buckets step (during this call), not at the commit.
  virtual absl::Status Extend(float grad_scale, std::vector<BucketGroup> groups, bool out_now) = 0;
};

// The first half of StepGroups: a failure (a read, a write, room, a bad bucket) leaves every
// state and parameter as it was, and says so.
absl::StatusOr<std::unique_ptr<PreparedStep>> PrepareGroups(AdamOptimizer& opt,
                                                            StateTensors& tensors,
                                                            StepVersions& versions,
                                                            int prefetch_depth, float grad_scale,
                                                            std::vector<BucketGroup> groups);

}  // namespace tiermem::optim
