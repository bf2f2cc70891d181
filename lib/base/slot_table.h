// Generation-checked slots, the one table behind every kind of C handle (runtimes, tensors, Adam
// optimizers): a handle is the slot's index, its generation and its kind (lib/base/handle.h), so
// a stale or destroyed handle, or one of another kind, names nothing. Generations come from a
// process-wide counter, so a handle of one table never names a slot of another table of its kind
// (a tensor of another runtime). Not thread-safe: its owner locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/base/handle.h"

namespace tiermem {

// The next generation of the process-wide counter (never 0).
uint32_t NextSlotGeneration();

template <typename T, HandleKind kKind>
class SlotTable {
 public:
  uint64_t Insert(T value) {
    uint32_t index = 0;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& s = slots_[index];
    s.generation = NextSlotGeneration();
    s.value = std::move(value);
    ++live_;
    return MakeHandle(kKind, s.generation, index);
  }
  // nullptr for zero, destroyed, stale or foreign handles.
  T* Find(uint64_t handle) {
    if (!HandleIsKind(handle, kKind)) return nullptr;
    const uint32_t index = HandleIndex(handle);
    const uint32_t gen = HandleGeneration(handle);
    if (gen == 0 || index >= slots_.size() || slots_[index].generation != gen) return nullptr;
    return &slots_[index].value;
  }
  const T* Find(uint64_t handle) const { return const_cast<SlotTable*>(this)->Find(handle); }
  // Takes the value out and frees the slot; T{} when the handle names nothing.
  T Remove(uint64_t handle) {
    T* v = Find(handle);
    if (v == nullptr) return T{};
    T out = std::move(*v);
    *v = T{};
    slots_[HandleIndex(handle)].generation = 0;
    free_.push_back(HandleIndex(handle));
    --live_;
    return out;
  }
  size_t size() const { return live_; }
  template <typename F>
  void ForEach(F&& f) {
    for (Slot& s : slots_) {
      if (s.generation != 0) f(s.value);
    }
  }

 private:
  struct Slot {
    uint32_t generation = 0;  // 0: free
    T value{};
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

}  // namespace tiermem
