// The handle table.
#include "lib/runtime/tensor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "lib/base/handle.h"

namespace tiermem {
namespace {
std::atomic<uint32_t> g_generation{0};

uint32_t NextGeneration() {
  uint32_t previous = g_generation.load();
  while (!g_generation.compare_exchange_weak(previous, NextHandleGeneration(previous))) {
  }
  return NextHandleGeneration(previous);
}
#if !defined(NDEBUG) || defined(TIERMEM_CHECK_TRANSITIONS)
std::atomic<bool> g_check_transitions{true};
#else
std::atomic<bool> g_check_transitions{false};
#endif
}  // namespace

bool TransitionChecksOn() { return g_check_transitions.load(std::memory_order_relaxed); }
void SetTransitionChecks(bool on) { g_check_transitions.store(on); }

void BadTransition(const Tensor& t, tm_tier tier, const char* transition) {
  std::fprintf(stderr,
               "tiermem: bad copy-state transition %s of tensor \"%s\" in %s: the copy is %s "
               "(%u pin(s))\n",
               transition, t.name.c_str(), tm_tier_name(tier), CopyStateName(t.copy(tier).state),
               t.copy(tier).pins);
  std::abort();
}

const char* CopyStateName(CopyState s) {
  switch (s) {
    case CopyState::kAbsent:
      return "absent";
    case CopyState::kFilling:
      return "filling";
    case CopyState::kValid:
      return "valid";
    case CopyState::kLanding:
      return "landing";
    case CopyState::kWriting:
      return "writing";
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
  return MakeHandle(HandleKind::kTensor, s.generation, index);
}

Tensor* TensorTable::Find(uint64_t handle) const {
  // A handle of another kind (a runtime's) never names a tensor, whatever its low bits.
  if (!HandleIsKind(handle, HandleKind::kTensor)) return nullptr;
  const uint32_t index = HandleIndex(handle);
  const uint32_t gen = HandleGeneration(handle);
  if (gen == 0 || index >= slots_.size()) return nullptr;
  const Slot& s = slots_[index];
  return s.generation == gen ? s.tensor.get() : nullptr;
}

std::unique_ptr<Tensor> TensorTable::Remove(uint64_t handle) {
  if (Find(handle) == nullptr) return nullptr;
  Slot& s = slots_[HandleIndex(handle)];
  s.generation = 0;
  free_.push_back(HandleIndex(handle));
  --live_;
  return std::move(s.tensor);
}

}  // namespace tiermem
