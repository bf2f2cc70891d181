// Copy-state names and the checks of their transitions.
#include "lib/runtime/tensor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "lib/base/handle.h"

namespace tiermem {
namespace {
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

}  // namespace tiermem
