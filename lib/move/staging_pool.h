// Pinned bounce buffers for moves between HBM and NVMe: a fixed set of chunk-sized slots carved
// from the DRAM pool (so they are registered with CUDA and io_uring), handed out in pairs for
// double buffering: chunk k+1 is read while chunk k is copied.
#pragma once

#include <cstdint>
#include <vector>

#include "io/sync.h"

namespace tiermem {

class StagingPool {
 public:
  // Sizes the pool for a DRAM budget: slots of `chunk` bytes (a multiple of `alignment`), shrunk
  // so that the pool takes at most a quarter of the budget.
  struct Shape {
    uint64_t chunk = 0;
    uint32_t slots = 0;
    uint64_t bytes() const { return chunk * slots; }
  };
  static Shape ShapeFor(uint64_t dram_bytes, uint64_t preferred_chunk, uint64_t alignment);

  StagingPool(char* base, Shape shape);
  uint64_t chunk() const { return shape_.chunk; }
  uint32_t slots() const { return shape_.slots; }

  // Blocks until `n` slots are free together (never a partial hold, so no deadlock).
  std::vector<char*> Acquire(uint32_t n);
  void Release(const std::vector<char*>& slots);

 private:
  Shape shape_;
  Mutex mu_;
  CondVar released_;  // signalled when slots come back
  std::vector<char*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tiermem
