// The CPU Adam step over many spans at once: the spans are cut into tiles that the pool's
// workers take in turn, each tile stepped in one pass that streams through the cache.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/optim/cpu_adam.h"
#include "lib/optim/stream_pool.h"

namespace tiermem::optim {

// Elements per tile: 64 KiB of each fp32 stream, so that the four to six streams of a tile
// fit in a core's L2 while the hardware prefetchers run ahead.
inline constexpr size_t kTileElements = 16384;

class AdamOptimizer {
 public:
  // `numa_node` < 0: workers unbound.
  static absl::StatusOr<std::unique_ptr<AdamOptimizer>> Create(const AdamHyper& hyper, int threads,
                                                               int numa_node);
  absl::Status SetHyper(const AdamHyper& hyper);
  const AdamHyper& hyper() const { return hyper_; }
  int threads() const { return pool_->threads(); }

  // Takes step number `step` (from 1) over the spans, gradients first multiplied by
  // `grad_scale`. Every span is checked before any is stepped.
  absl::Status Step(uint64_t step, float grad_scale, const AdamSpan* spans, size_t count) {
    return StepWith(hyper_, step, grad_scale, spans, count);
  }
  // The same with other hyperparameters than the optimizer's (a parameter group's).
  absl::Status StepWith(const AdamHyper& hyper, uint64_t step, float grad_scale,
                        const AdamSpan* spans, size_t count);

 private:
  AdamOptimizer() = default;
  AdamHyper hyper_;
  std::unique_ptr<StreamPool> pool_;
};

// TM_ERR_INVALID_ARGUMENT naming the field of span `index` that is wrong, for `amsgrad`.
absl::Status ValidateSpan(const AdamSpan& span, size_t index, bool amsgrad);

}  // namespace tiermem::optim
