// The handle table.
#include "lib/tensor.h"

#include <atomic>

namespace tiermem {
namespace {
std::atomic<uint32_t> g_generation{0};

uint32_t NextGeneration() {
  uint32_t g = 0;
  while ((g = ++g_generation) == 0) {
  }
  return g;
}
}  // namespace

const char* CopyStateName(CopyState s) {
  switch (s) {
    case CopyState::kAbsent: return "absent";
    case CopyState::kFilling: return "filling";
    case CopyState::kValid: return "valid";
    case CopyState::kLanding: return "landing";
    case CopyState::kWriting: return "writing";
  }
  return "?";
}

uint64_t TensorTable::Insert(std::unique_ptr<Tensor> t) {
  uint32_t index = 0;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[index];
  s.generation = NextGeneration();
  s.tensor = std::move(t);
  ++live_;
  return uint64_t{s.generation} << 32 | index;
}

Tensor* TensorTable::Find(uint64_t handle) const {
  uint32_t index = static_cast<uint32_t>(handle);
  uint32_t gen = static_cast<uint32_t>(handle >> 32);
  if (gen == 0 || index >= slots_.size()) return nullptr;
  const Slot& s = slots_[index];
  return s.generation == gen ? s.tensor.get() : nullptr;
}

std::unique_ptr<Tensor> TensorTable::Remove(uint64_t handle) {
  if (Find(handle) == nullptr) return nullptr;
  uint32_t index = static_cast<uint32_t>(handle);
  Slot& s = slots_[index];
  s.generation = 0;
  free_.push_back(index);
  --live_;
  return std::move(s.tensor);
}

}  // namespace tiermem
