// The lock types of tiermem: std::mutex and std::condition_variable behind Abseil's names and
// thread-safety annotations, in every build. One implementation for all builds, for two reasons:
// - ThreadSanitizer understands std::mutex; Debian's Abseil is not built with TSan, so
//   absl::Mutex's own futex waits would make every guarded access look like a race.
// - Debian's Abseil is built without NDEBUG, so absl::Mutex runs its deadlock detection on every
//   acquire (a global graph of lock orders: about 100 ns of each tm_tensor_acquire + release pair,
//   and a setting global to the host process, which a library must not change).
// TSan checks lock-order inversions in CI; clang -Wthread-safety checks the annotations.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace tiermem {

class ABSL_LOCKABLE Mutex {
 public:
  // Spins a little before sleeping, as glibc's adaptive mutex does: the runtime's lock is held
  // for a microsecond or two at a time, and a thread put to sleep for it costs the holder a
  // futex wake-up at unlock, several times the wait (more on a virtual machine, where waking a
  // thread on another CPU is an interrupt to the hypervisor).
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (m_.try_lock()) return;
    const auto until = std::chrono::steady_clock::now() + kSpin;
    do {
      for (int i = 0; i < 16; ++i) Relax();
      if (m_.try_lock()) return;
    } while (std::chrono::steady_clock::now() < until);
    m_.lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { m_.unlock(); }

 private:
  static constexpr std::chrono::nanoseconds kSpin{5000};
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
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

}  // namespace tiermem
