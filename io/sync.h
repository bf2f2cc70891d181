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
#include <cstdint>
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

// A condition for threads that wait while holding another lock (`held`), rung by threads that
// hold it too: a waiter sleeps on the bell's own lock, so that a ring wakes it with `held` still
// free to take once its ringer lets go, rather than into a wait for `held` that the ringer's
// unlock must end with a second wake-up. A ring is never lost: it counts, and a waiter sleeps
// only until the count moves past what it saw before letting go of `held`.
class Doorbell {
 public:
  // With `held` locked, after the waiter's condition was found false: lets go of `held`, sleeps
  // until a ring after this call (or a spurious wake-up), then locks `held` again.
  void Wait(Mutex* held) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(m_);
    const uint64_t seen = rings_;
    held->Unlock();
    cv_.wait(lock, [&] { return rings_ != seen; });
    lock.unlock();
    held->Lock();
  }
  // Wakes one waiter / all of them.
  void Ring() {
    {
      std::lock_guard<std::mutex> lock(m_);
      ++rings_;
    }
    cv_.notify_one();
  }
  void RingAll() {
    {
      std::lock_guard<std::mutex> lock(m_);
      ++rings_;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t rings_ = 0;
};

}  // namespace tiermem
