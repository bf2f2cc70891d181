// The Adam step over state held in tiermem tensors, pipelined by bucket: the state of the
// buckets ahead is prefetched into DRAM while the current one steps, and state that came from
// NVMe is offloaded back behind it. Each bucket is stepped whole or not at all.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/optim/adam_optimizer.h"
#include "tiermem/tiermem.h"

namespace tiermem::optim {

// The tensor operations the pipeline needs, as the runtime offers them; one implementation goes
// through the C API's handles, another straight to a Runtime (runtime_state.h).
class StateTensors {
 public:
  virtual ~StateTensors() = default;
  virtual absl::StatusOr<uint64_t> Bytes(uint64_t tensor) = 0;
  virtual absl::StatusOr<uint32_t> Residency(uint64_t tensor) = 0;
  virtual absl::Status Prefetch(uint64_t tensor, tm_tier tier) = 0;
  virtual absl::StatusOr<void*> Acquire(uint64_t tensor, tm_tier tier, tm_access access) = 0;
  virtual absl::Status Release(uint64_t tensor, tm_tier tier) = 0;
  virtual absl::Status Offload(uint64_t tensor, tm_tier tier) = 0;
  virtual absl::Status Sync(uint64_t tensor) = 0;
};

struct BucketStepResult {
  absl::Status status;
  size_t buckets_done = 0;  // stepped whole; the rest untouched
};

// `prefetch_depth`: buckets read ahead of the one stepping (0: none).
BucketStepResult StepBuckets(AdamOptimizer& opt, StateTensors& tensors, int prefetch_depth,
                             uint64_t step, float grad_scale, const tm_adam_bucket* buckets,
                             size_t count);

}  // namespace tiermem::optim
