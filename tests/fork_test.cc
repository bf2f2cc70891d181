// A fork()ed child inherits handles whose threads stayed in the parent (a DataLoader's workers,
// multiprocessing's fork): the child's calls on them fail, naming the fork, its destroys free
// nothing and return at once (joining the parent's threads hung or crashed the child), and the
// parent's runtime goes on untouched. A runtime the child makes itself works.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::OffloadNow;
using testing::RandomBytes;
using testing::SmallConfig;
using testing::TempDir;

// Under a sanitizer the child makes no runtime of its own: TSan stops the child of a threaded
// parent that starts threads, and under ASan that child hung in the sanitizer's own bookkeeping
// (its runtime's threads and allocations; a release build does not).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// In the child: a check that failed is printed and makes the exit status non-zero (gtest's
// assertions belong to the parent's process).
int failures = 0;
void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "child: %s\n", what.c_str());
    ++failures;
  }
}

int WaitFor(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Fork, AChildRefusesInheritedHandlesAndTheParentGoesOn) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  const uint64_t n = 1 << 20;
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = n;
  d.name = "kept";
  tm_tensor t{};
  ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << tm_last_error();
  const std::vector<uint8_t> data = RandomBytes(n, 7);
  ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), n), TM_OK) << tm_last_error();
  ASSERT_EQ(OffloadNow(rt, t, TM_TIER_NVME), TM_OK) << tm_last_error();  // its movers ran
  tm_adam_config ac = TM_ADAM_CONFIG_INIT;
  ac.threads = 2;
  tm_adam adam{};
  ASSERT_EQ(tm_adam_create(rt, &ac, &adam), TM_OK) << tm_last_error();

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<uint8_t> back(n);
    Check(tm_tensor_read(rt, t, 0, back.data(), n) == TM_ERR_INVALID_HANDLE,
          "a read of the parent's tensor was not refused");
    const std::string msg = tm_last_error();
    Check(msg.find("forked") != std::string::npos &&
              msg.find("make a new one in this process") != std::string::npos,
          "the refusal does not name the fork: " + msg);
    tm_stats s = TM_STATS_INIT;
    Check(tm_runtime_stats(rt, &s) == TM_ERR_INVALID_HANDLE, "stats were not refused");
    Check(tm_adam_set_hyper(adam, &ac) == TM_ERR_INVALID_HANDLE, "the adam was not refused");
    Check(tm_adam_destroy(adam) == TM_OK, "the adam's destroy failed");
    Check(tm_runtime_destroy(rt) == TM_OK, "the runtime's destroy failed");  // returns: no join
    Check(tm_runtime_destroy(rt) == TM_ERR_INVALID_HANDLE, "a second destroy was not refused");
    if (!kSanitized) {
      TempDir child_dir;
      tm_config c = SmallConfig(child_dir.path());
      tm_runtime mine{};
      Check(tm_runtime_create(&c, &mine) == TM_OK,
            std::string("a runtime of the child's own: ") + tm_last_error());
      tm_tensor x{};
      Check(tm_tensor_create(mine, &d, &x) == TM_OK, "a tensor of the child's runtime");
      Check(tm_tensor_write(mine, x, 0, data.data(), n) == TM_OK, "its write");
      Check(OffloadNow(mine, x, TM_TIER_NVME) == TM_OK, "its offload");
      Check(tm_tensor_read(mine, x, 0, back.data(), n) == TM_OK && back == data, "its read");
      Check(tm_runtime_destroy(mine) == TM_OK, "its destroy");
    }
    std::fflush(stderr);
    _exit(failures == 0 ? 0 : 1);
  }
  EXPECT_EQ(WaitFor(pid), 0) << "the child's checks failed (its stderr says which)";
  // The parent's runtime, tensor and optimizer are as they were.
  std::vector<uint8_t> back(n);
  EXPECT_EQ(tm_tensor_read(rt, t, 0, back.data(), n), TM_OK) << tm_last_error();
  EXPECT_TRUE(back == data);
  EXPECT_EQ(tm_adam_set_hyper(adam, &ac), TM_OK) << tm_last_error();
  EXPECT_EQ(tm_adam_destroy(adam), TM_OK) << tm_last_error();
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK) << tm_last_error();
}

// A child that only exits, through exit() and its atexit handlers as an interpreter's finalizers
// do, with the parent's runtime destroyed on the way out (its movers had run): it crashed in
// pthread_join, or hung on a condition variable of a thread that never followed.
TEST(Fork, AChildDestroyingTheParentsRuntimeAtExitExitsCleanly) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  static tm_runtime rt{};  // reached from the atexit handler
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 1 << 20;
  tm_tensor t{};
  ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << tm_last_error();
  std::vector<uint8_t> data(d.bytes, 3);
  ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), data.size()), TM_OK);
  ASSERT_EQ(OffloadNow(rt, t, TM_TIER_NVME), TM_OK) << tm_last_error();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atexit([] { std::_Exit(tm_runtime_destroy(rt) == TM_OK ? 0 : 1); });
    std::exit(2);
  }
  EXPECT_EQ(WaitFor(pid), 0);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK) << tm_last_error();
}

}  // namespace
}  // namespace tiermem
