// The C boundary's shared parts (see c_boundary.h), and tm_last_error.
#include "lib/api/c_boundary.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdlib>

#include "lib/base/last_error.h"

namespace tiermem {
namespace {

std::atomic<uint64_t> fork_generation{0};

// The mutexes held across fork(): a fixed array (no allocation in the handlers), filled at
// start-up by the registries' constructors.
constexpr int kMaxHeld = 8;
std::array<std::atomic<Mutex*>, kMaxHeld> held{};
std::atomic<int> held_count{0};

void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (int i = 0; i < held_count.load(); ++i) held[i].load()->Lock();
}
void AfterForkInParent() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (int i = held_count.load() - 1; i >= 0; --i) held[i].load()->Unlock();
}
void AfterForkInChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  fork_generation.fetch_add(1);
  for (int i = held_count.load() - 1; i >= 0; --i) held[i].load()->Unlock();
}

}  // namespace

uint64_t ForkGeneration() { return fork_generation.load(std::memory_order_relaxed); }

void HoldAcrossFork(Mutex* mu) {
  static const bool registered = [] {
    return pthread_atfork(PrepareFork, AfterForkInParent, AfterForkInChild) == 0;
  }();
  (void)registered;  // without it (ENOMEM at start-up) a child may find a registry locked
  const int i = held_count.load();
  if (i >= kMaxHeld) std::abort();  // a registry more than the array holds: a build error
  held[i].store(mu);
  held_count.store(i + 1);
}

tm_status Fail(tm_status code, absl::string_view message) {
  LastErrorSlot().assign(message.data(), message.size());
  LastErrorFlagsSlot() = 0;
  return code;
}

tm_status Report(const absl::Status& s) {
  if (s.ok()) return TM_OK;
  const tm_status code = Fail(ToTmStatus(s), s.message());
  LastErrorFlagsSlot() = ErrorFlags(s);
  return code;
}

tm_status NullArgument(const char* function, const char* argument) {
  return Fail(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: %s is NULL", function, argument));
}

const char* LastError() { return LastErrorSlot().c_str(); }

uint32_t LastErrorFlags() { return LastErrorFlagsSlot(); }

RuntimeRegistry& Registry() {
  static RuntimeRegistry* r = new RuntimeRegistry();  // never destroyed: safe at exit
  return *r;
}

}  // namespace tiermem
