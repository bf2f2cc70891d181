// Pinned bounce buffers for moves between HBM (or a caller's device memory) and NVMe: a fixed
// ring of chunk-sized slots carved from the DRAM pool (so they are registered with CUDA and
// io_uring), leased in pairs for double buffering: chunk k+1 is read while chunk k is copied.
// A lease gives its slots back when it goes out of scope.
#pragma once

#include <cstdint>
#include <vector>

#include "io/sync.h"

namespace tiermem {

class StagingRing {
 public:
  // Sizes the ring for a DRAM budget: slots of `chunk` bytes (a multiple of `alignment`), shrunk
  // so that the ring takes at most a quarter of the budget.
  struct Shape {
    uint64_t chunk = 0;
    uint32_t slots = 0;
    uint64_t bytes() const { return chunk * slots; }
  };
  static Shape ShapeFor(uint64_t dram_bytes, uint64_t preferred_chunk, uint64_t alignment);

  // Slots held together; handed back to the ring by the destructor.
  class Lease {
   public:
    Lease(StagingRing& ring, std::vector<char*> slots) : ring_(&ring), slots_(std::move(slots)) {}
    ~Lease() {
      if (ring_ != nullptr) ring_->Release(slots_);
    }
    Lease(Lease&& o) noexcept : ring_(o.ring_), slots_(std::move(o.slots_)) { o.ring_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    char* operator[](size_t i) const { return slots_[i]; }
    size_t size() const { return slots_.size(); }

   private:
    StagingRing* ring_;
    std::vector<char*> slots_;
  };

  StagingRing(char* base, Shape shape);
  uint64_t chunk() const { return shape_.chunk; }
  uint32_t slots() const { return shape_.slots; }

  // Blocks until `n` slots are free together (never a partial hold, so no deadlock).
  Lease Acquire(uint32_t n);

 private:
  void Release(const std::vector<char*>& slots);

  Shape shape_;
  Mutex mu_;
  CondVar released_;  // signalled when slots come back
  std::vector<char*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tiermem
