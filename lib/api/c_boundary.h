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

// Objects behind C handles of one kind, in a process-wide table of generation-checked slots
// (lib/base/slot_table.h). Calls hold a shared_ptr, so a destroy racing with a call frees the
// object only after that call returns.
template <typename T, HandleKind kKind>
class HandleRegistry {
 public:
  uint64_t Add(std::shared_ptr<T> v) {
    MutexLock lock(&mu_);
    return slots_.Insert(std::move(v));
  }
  std::shared_ptr<T> Get(uint64_t bits) {
    MutexLock lock(&mu_);
    std::shared_ptr<T>* v = slots_.Find(bits);
    return v != nullptr ? *v : nullptr;
  }
  std::shared_ptr<T> Remove(uint64_t bits) {
    MutexLock lock(&mu_);
    return slots_.Remove(bits);
  }
  // Runs `body(T&)`, which returns a tm_status, with the object of `bits`: a bad handle is
  // TM_ERR_INVALID_HANDLE naming `what`, an exception a status.
  template <typename Body>
  tm_status With(uint64_t bits, const char* what, Body&& body) {
    std::shared_ptr<T> v = Get(bits);
    if (v == nullptr) {
      return Fail(TM_ERR_INVALID_HANDLE,
                  absl::StrFormat("%s handle 0x%016x is zero, destroyed or invalid", what, bits));
    }
    return Guarded([&] { return body(*v); });
  }

 private:
  Mutex mu_;
  SlotTable<std::shared_ptr<T>, kKind> slots_ ABSL_GUARDED_BY(mu_);
};

using RuntimeRegistry = HandleRegistry<Runtime, HandleKind::kRuntime>;
RuntimeRegistry& Registry();

// Runs `body` with the runtime of `rt`, turning a bad handle or an exception into a status.
template <typename Body>
tm_status WithRuntime(tm_runtime rt, Body&& body) {
  return Registry().With(rt.bits, "runtime", [&](Runtime& r) { return Report(body(r)); });
}

}  // namespace tiermem
