// Tensor records and the generation-checked handle table that names them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "io/copy_engine.h"
#include "lib/tier_space.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// A tensor's copy in one tier. Invariant: all valid copies of a tensor hold the same bytes.
struct TensorCopy {
  Extent extent;       // reserved space; may be non-empty while not yet valid (filling)
  bool valid = false;  // set only after every completion of the move into it was checked
  uint32_t pins = 0;   // outstanding acquires: a pinned copy is never freed or moved
  // Acquired for writing (until its last release): its bytes are in flux, so no other copy may
  // be made from it.
  bool writing = false;
};

// All fields are guarded by the runtime's lock.
struct Tensor {
  uint64_t handle = 0;
  uint64_t last_use = 0;  // runtime tick of the last acquire: LRU order
  uint64_t bytes = 0;
  tm_tensor_class cls = TM_CLASS_OTHER;
  tm_tier home = TM_TIER_HBM;
  std::string name;
  std::array<TensorCopy, TM_TIER_COUNT> copies;
  // A move or host copy of this tensor runs outside the runtime's lock: every other operation
  // on it waits (so extents and copies it uses stay put).
  bool busy = false;
  // Asynchronous moves queued and not yet started.
  uint32_t queued = 0;
  // The first failure of an asynchronous move, until a sync reports it.
  absl::Status error;
  // A stream-ordered copy into HBM that the host has not waited for yet.
  std::optional<io::CopyTicket> pending;

  TensorCopy& copy(tm_tier t) { return copies[t]; }
  // Whether any tier holds it; a tensor never written reads as zeros.
  bool materialized() const {
    for (const auto& c : copies) {
      if (c.valid) return true;
    }
    return false;
  }
  uint32_t ResidencyMask() const {
    uint32_t m = 0;
    for (int t = 0; t < TM_TIER_COUNT; ++t) {
      if (copies[t].valid) m |= TM_TIER_BIT(t);
    }
    return m;
  }
  // The tier whose copy is being written through an acquire, or -1.
  int writing_tier() const {
    for (int t = 0; t < TM_TIER_COUNT; ++t) {
      if (copies[t].writing) return t;
    }
    return -1;
  }
  bool pinned() const {
    for (const auto& c : copies) {
      if (c.pins > 0) return true;
    }
    return false;
  }
};

// Slots indexed by the low 32 bits of a handle; above them the slot's generation, drawn from a
// process-wide counter so that a handle from one runtime never names a tensor of another and a
// destroyed handle never names its slot's next tenant, and the tensor kind tag, so that no
// runtime handle is ever taken for a tensor (layout in lib/handle.h). Not thread-safe.
class TensorTable {
 public:
  uint64_t Insert(std::unique_ptr<Tensor> t);
  // nullptr for zero, destroyed, stale or foreign handles.
  Tensor* Find(uint64_t handle) const;
  std::unique_ptr<Tensor> Remove(uint64_t handle);
  size_t size() const { return live_; }
  template <typename F>
  void ForEach(F&& f) {
    for (auto& s : slots_) {
      if (s.tensor) f(*s.tensor);
    }
  }

 private:
  struct Slot {
    uint32_t generation = 0;
    std::unique_ptr<Tensor> tensor;
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

}  // namespace tiermem
