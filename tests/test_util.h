// Test helpers: an RAII environment guard, a temporary swap directory, random bytes, and the
// ways a test waits for an event (a latch, a polled condition, a call that must not block).
#pragma once

#include <dirent.h>
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tiermem/tiermem.h"

// Asserts that a tm_* call succeeded, showing the call and tm_last_error() when it did not.
#define TM_ASSERT_OK(call) ASSERT_EQ((call), TM_OK) << #call << ": " << tm_last_error()

namespace tiermem::testing {

// The whole file at `path` (a trace the runtime wrote, say); "" when it cannot be read.
inline std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

// Whether this build runs under AddressSanitizer or ThreadSanitizer: every memory access is
// checked, so the heaviest tests run fewer rounds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// The process's vm.max_map_count when a test may use it up (split a region page by page until
// the kernel refuses); 0, with the reason in *why, when it may not: a sanitizer's runtime needs
// mappings of its own, and a huge limit would take too long to reach.
inline uint64_t MappingsToUseUp(std::string* why) {
  if (kSanitized) {
    *why =
        "a sanitizer's runtime needs memory mappings of its own: the process cannot be taken "
        "to vm.max_map_count under it (the plain build runs this)";
    return 0;
  }
  uint64_t max_maps = 0;
  std::ifstream("/proc/sys/vm/max_map_count") >> max_maps;
  if (max_maps == 0 || max_maps > (1u << 20)) {
    *why = "vm.max_map_count is " + std::to_string(max_maps) + ": too many mappings to use up here";
    return 0;
  }
  return max_maps;
}

// Tests allocate and free buffers of tens of MiB again and again (RandomBytes, read-backs). glibc
// serves each from a fresh mmap and unmaps it when freed, so every page is faulted in anew, and on
// a VM a fault costs tens of microseconds (twenty 64 MiB vectors: 7.5 s, against 0.4 s with the
// memory kept; errors_test: 19 s against 7 s). Freed memory stays in the heap instead. What the
// library does is unchanged; under a sanitizer, whose allocator replaces glibc's, this does
// nothing.
inline const bool kHeapKeptForTests = [] {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}();

// Sets (or unsets) environment variables for a scope and restores them after.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const char* name, std::optional<std::string> value) { Set(name, std::move(value)); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second.has_value()) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }
  void Set(const char* name, std::optional<std::string> value) {
    const char* old = getenv(name);
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    if (value.has_value()) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A fresh directory under /var/tmp (ext4 here: O_DIRECT works), removed with its files.
class TempDir {
 public:
  explicit TempDir(const char* base = "/var/tmp") {
    std::string templ = std::string(base) + "/tiermem-test-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() { Remove(); }
  // Removes the directory now: for a death test's child, which ends in exit() and so never
  // runs the destructor of its fixture's TempDir.
  void Remove() {
    if (path_.empty()) return;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") unlink((path_ + "/" + n).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
    path_.clear();
  }
  const std::string& path() const { return path_; }
  // Entries other than . and ..
  int Entries() const {
    int n = 0;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        n += name != "." && name != "..";
      }
      closedir(d);
    }
    return n;
  }

 private:
  std::string path_;
};

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    __builtin_memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

// Offloads and waits: the status of the whole move.
inline tm_status OffloadNow(tm_runtime rt, tm_tensor t, tm_tier tier) {
  tm_status s = tm_tensor_offload(rt, t, tier);
  return s != TM_OK ? s : tm_tensor_sync(rt, t);
}

// A tm_config for tests: emulated device, small budgets, swap files in `dir`. With
// TIERMEM_TEST_DEVICE=cuda (tools/gpu_check.sh, for suites that never touch HBM memory from the
// host), the GPU instead.
inline tm_config SmallConfig(const std::string& dir, tm_io_engine engine = TM_IO_ENGINE_DEFAULT) {
  tm_config c = TM_CONFIG_INIT;
  const char* test_device = getenv("TIERMEM_TEST_DEVICE");
  c.device = test_device != nullptr && std::string(test_device) == "cuda" ? TM_DEVICE_CUDA
                                                                          : TM_DEVICE_EMULATED;
  c.hbm_bytes = 96ull << 20;
  c.dram_bytes = 96ull << 20;
  c.nvme_bytes = 256ull << 20;
  c.nvme_paths = dir.c_str();
  c.io_engine = engine;
  return c;
}

// The config keeps a pointer to `dir`: a temporary would dangle.
tm_config SmallConfig(std::string&& dir, tm_io_engine engine = TM_IO_ENGINE_DEFAULT) = delete;

// How long a test waits for an event before it calls the event lost. Never a timing: what the
// test waits for comes at once when the code is right; the patience only turns a broken order
// into a failure instead of a hang (a loaded 2-core machine under TSan included).
inline constexpr std::chrono::seconds kPatience{60};

// Holds work a test queued (on a stream, on another thread) until the test opens it: whatever
// the test checks before Open() happened while that work had not run. It never holds for
// longer than kPatience: it then opens by itself and says so (expired()), so that a call that
// wrongly waited for the held work fails its test instead of hanging it.
class Latch {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Blocks until open.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kPatience, [&] { return open_; })) expired_ = open_ = true;
  }
  bool expired() {
    std::lock_guard<std::mutex> lock(mu_);
    return expired_;
  }

 private:
  std::mutex mu_;  // guards open_ and expired_
  std::condition_variable cv_;
  bool open_ = false, expired_ = false;
};

// Polls `condition` until it holds; false when kPatience runs out first. For a state the
// library raises no event for (a counter of tm_stats, a file system's free space once the kernel
// has torn a process down).
template <typename Condition>
bool WaitUntil(Condition&& condition) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a wait: spaces out the polls
  }
  return true;
}

// Runs `call` on a thread of its own: true when it returns within kPatience. When it does not
// (it waits for what it must not wait for), `unblock` runs so that it can return, and the answer
// is false: the test fails instead of hanging.
template <typename Call, typename Unblock>
bool ReturnsWithoutWaiting(Call&& call, Unblock&& unblock) {
  std::mutex mu;  // guards done
  std::condition_variable cv;
  bool done = false;
  std::thread runner([&] {
    call();
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  bool in_time;
  {
    std::unique_lock<std::mutex> lock(mu);
    in_time = cv.wait_for(lock, kPatience, [&] { return done; });
  }
  if (!in_time) unblock();
  runner.join();
  return in_time;
}

}  // namespace tiermem::testing
