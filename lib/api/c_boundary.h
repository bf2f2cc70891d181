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

// Runtimes live in a process-wide table of generation-checked slots, their handles tagged with
// the runtime kind (lib/base/handle.h). Calls hold a shared_ptr, so a destroy racing with a call
// frees the runtime only after that call returns.
class RuntimeRegistry {
 public:
  uint64_t Add(std::shared_ptr<Runtime> rt) {
    MutexLock lock(&mu_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    next_generation_ = NextHandleGeneration(next_generation_);
    slots_[index] = {next_generation_, std::move(rt)};
    return MakeHandle(HandleKind::kRuntime, next_generation_, index);
  }
  std::shared_ptr<Runtime> Get(uint64_t bits) {
    MutexLock lock(&mu_);
    Slot* s = Find(bits);
    return s != nullptr ? s->runtime : nullptr;
  }
  std::shared_ptr<Runtime> Remove(uint64_t bits) {
    MutexLock lock(&mu_);
    Slot* s = Find(bits);
    if (s == nullptr) return nullptr;
    std::shared_ptr<Runtime> rt = std::move(s->runtime);
    s->generation = 0;
    free_.push_back(static_cast<uint32_t>(bits));
    return rt;
  }

 private:
  struct Slot {
    uint32_t generation = 0;
    std::shared_ptr<Runtime> runtime;
  };
  Slot* Find(uint64_t bits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // A tensor handle never names a runtime, whatever its generation and index bits.
    if (!HandleIsKind(bits, HandleKind::kRuntime)) return nullptr;
    const uint32_t index = HandleIndex(bits);
    const uint32_t gen = HandleGeneration(bits);
    if (gen == 0 || index >= slots_.size() || slots_[index].generation != gen) return nullptr;
    return &slots_[index];
  }
  Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  uint32_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

RuntimeRegistry& Registry();

// Runs `body` with the runtime of `rt`, turning a bad handle or an exception into a status.
template <typename Body>
tm_status WithRuntime(tm_runtime rt, Body&& body) {
  std::shared_ptr<Runtime> r = Registry().Get(rt.bits);
  if (r == nullptr) {
    return Fail(TM_ERR_INVALID_HANDLE,
                absl::StrFormat("runtime handle 0x%016x is zero, destroyed or invalid", rt.bits));
  }
  try {
    return Report(body(*r));
  } catch (const std::bad_alloc&) {
    return Fail(TM_ERR_OUT_OF_MEMORY, "host memory exhausted (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Fail(TM_ERR_INTERNAL, absl::StrFormat("unexpected exception: %s", e.what()));
  } catch (...) {
    return Fail(TM_ERR_INTERNAL, "unexpected exception");
  }
}

}  // namespace tiermem
