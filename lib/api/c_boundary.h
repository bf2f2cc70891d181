// The C boundary's shared parts: the thread's last error, statuses turned into tm_status, the
// process-wide table of runtimes, and the wrapper that keeps every exception inside.
#pragma once

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/sync.h"
#include "lib/base/handle.h"
#include "lib/base/slot_table.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// Sets the thread's last error (tm_last_error) and returns `code`.
tm_status Fail(tm_status code, absl::string_view message);
// TM_OK, or the status's tm_status with its message as the last error.
tm_status Report(const absl::Status& s);
tm_status NullArgument(const char* function, const char* argument);
// The thread's last error, for tm_last_error.
const char* LastError();
// Its TM_ERROR_* flags, for tm_last_error_flags.
uint32_t LastErrorFlags();

// Runs `body` (returning tm_status), turning an exception into a status.
template <typename Body>
tm_status Guarded(Body&& body) {
  try {
    return body();
  } catch (...) {
    return Report(CurrentExceptionStatus());
  }
}

// How many times this process is a fork()ed child of the one before (0 in the process that
// started): an object made in a parent has no threads in the child (fork copies the calling
// thread only), so its handle is told apart there by the generation it was made in.
uint64_t ForkGeneration();
// Keeps `mu` held by the thread calling fork() across it (pthread_atfork), so that a child
// never inherits it locked by a thread that did not follow; registered once, never removed.
void HoldAcrossFork(Mutex* mu);

// Objects behind C handles of one kind, in a process-wide table of generation-checked slots
// (lib/base/slot_table.h). Calls hold a shared_ptr, so a destroy racing with a call frees the
// object only after that call returns. In a fork()ed child, the objects made before the fork are
// refused by name (their threads stayed in the parent) and their destroy frees nothing.
template <typename T, HandleKind kKind>
class HandleRegistry {
 public:
  HandleRegistry() { HoldAcrossFork(&mu_); }
  uint64_t Add(std::shared_ptr<T> v) {
    MutexLock lock(&mu_);
    return slots_.Insert(Entry{std::move(v), ForkGeneration()});
  }
  // The object of `bits` (nullptr: none); *inherited: made before this process forked.
  std::shared_ptr<T> Get(uint64_t bits, bool* inherited) {
    MutexLock lock(&mu_);
    Entry* e = slots_.Find(bits);
    if (e == nullptr) return nullptr;
    *inherited = e->generation != ForkGeneration();
    return e->object;
  }
  // Takes the object out of the table; *inherited: made before this process forked, it is kept
  // whole here (never destroyed: joining its threads, which stayed in the parent, would hang).
  std::shared_ptr<T> Remove(uint64_t bits, bool* inherited) {
    MutexLock lock(&mu_);
    Entry e = slots_.Remove(bits);
    *inherited = e.object != nullptr && e.generation != ForkGeneration();
    if (*inherited) inherited_.push_back(e.object);
    return std::move(e.object);
  }
  // Runs `body(T&)`, which returns a tm_status, with the object of `bits`: a bad handle (or one
  // made before this process forked) is TM_ERR_INVALID_HANDLE naming `what`, an exception a
  // status.
  template <typename Body>
  tm_status With(uint64_t bits, const char* what, Body&& body) {
    bool inherited = false;
    std::shared_ptr<T> v = Get(bits, &inherited);
    if (v == nullptr) return BadHandle(what, bits);
    if (inherited) return Inherited(what, bits);
    return Guarded([&] { return body(*v); });
  }

  static tm_status BadHandle(const char* what, uint64_t bits) {
    return Fail(TM_ERR_INVALID_HANDLE,
                absl::StrFormat("%s handle 0x%016x is %s", what, bits,
                                HandleMismatch(bits, kKind, "zero, destroyed or invalid").c_str()));
  }
  static tm_status Inherited(const char* what, uint64_t bits) {
    return Fail(TM_ERR_INVALID_HANDLE,
                absl::StrFormat("%s handle 0x%016x was made before this process was forked from "
                                "the one that made it: its threads stayed there, so it cannot be "
                                "used here (destroying it frees nothing here); make a new one in "
                                "this process",
                                what, bits));
  }

 private:
  struct Entry {
    std::shared_ptr<T> object;
    uint64_t generation = 0;  // ForkGeneration() when it was made
  };
  Mutex mu_;
  SlotTable<Entry, kKind> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<T>> inherited_ ABSL_GUARDED_BY(mu_);  // destroyed in a child
};

using RuntimeRegistry = HandleRegistry<Runtime, HandleKind::kRuntime>;
RuntimeRegistry& Registry();

// Runs `body` with the runtime of `rt`, turning a bad handle or an exception into a status.
template <typename Body>
tm_status WithRuntime(tm_runtime rt, Body&& body) {
  return Registry().With(rt.bits, "runtime", [&](Runtime& r) { return Report(body(r)); });
}

}  // namespace tiermem
