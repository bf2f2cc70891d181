// The lock types of tiermem: Abseil's, except under ThreadSanitizer. Debian's Abseil is not
// built with TSan, so absl::Mutex's synchronization (its own futex waits, conditions evaluated by
// the unlocking thread) is invisible to TSan and every guarded access would look like a race.
// TSan builds use std::mutex, which TSan understands, behind the same names and thread-safety
// annotations.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#include <condition_variable>
#include <mutex>
#else
#include "absl/synchronization/mutex.h"
#endif

namespace tiermem {

#if defined(__SANITIZE_THREAD__)

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { m_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { m_.unlock(); }

 private:
  friend class CondVar;
  std::mutex m_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* m) ABSL_EXCLUSIVE_LOCK_FUNCTION(m) : m_(m) { m_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { m_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* m_;
};

class CondVar {
 public:
  void Wait(Mutex* m) {
    std::unique_lock<std::mutex> lock(m->m_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held, by the caller
  }
  // Returns true on timeout, as absl::CondVar does.
  bool WaitWithTimeout(Mutex* m, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(m->m_, std::adopt_lock);
    const bool timed_out =
        cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout)) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

#else

using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using CondVar = absl::CondVar;

#endif

}  // namespace tiermem
