// The job queue's order: prefetches (scheduled, or hints) go before queued offloads, one tensor's
// jobs keep their order; and in a runtime, a scheduled prefetch does not wait behind offloads
// nobody waits for, while an offload of a tensor the schedule uses within the prefetch depth is
// dropped rather than written down and read back; large prefetches up the link take turns in the
// order of their uses (LinkOrder), each after the copy before it.
#include "lib/runtime/job_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "io/copy_gate.h"
#include "lib/runtime/link_order.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

Job Offload(uint64_t h) { return Job{h, TM_TIER_NVME, JobKind::kOffload}; }
Job Prefetch(uint64_t h) { return Job{h, TM_TIER_HBM, JobKind::kPrefetch, 7, 100}; }
Job Hint(uint64_t h) { return Job{h, TM_TIER_DRAM, JobKind::kHint}; }

// Pops and finishes jobs one at a time (so at most one offload runs).
std::vector<uint64_t> Drain(JobQueue& q) {
  std::vector<uint64_t> order;
  while (auto job = q.Pop(1)) {
    order.push_back(job->handle);
    q.Done(*job);
  }
  return order;
}

TEST(JobQueue, PrefetchesGoBeforeOffloads) {
  JobQueue q;
  q.Push(Offload(1));
  q.Push(Offload(2));
  q.Push(Prefetch(3));
  q.Push(Offload(4));
  q.Push(Hint(5));
  EXPECT_EQ(q.outstanding(), 5u);
  EXPECT_EQ(q.prefetch_in_flight(), 100u);
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{3, 5, 1, 2, 4}));
  EXPECT_EQ(q.outstanding(), 0u);
  EXPECT_EQ(q.prefetch_in_flight(), 0u);
}

TEST(JobQueue, OneTensorsJobsKeepTheirOrder) {
  JobQueue q;
  q.Push(Offload(1));
  q.Push(Prefetch(1));  // must not pass its own tensor's offload
  q.Push(Offload(2));
  q.Push(Hint(3));
  q.Push(Hint(2));  // nor this one
  const std::vector<uint64_t> order = Drain(q);
  EXPECT_EQ(order, (std::vector<uint64_t>{3, 1, 1, 2, 2}));
}

TEST(JobQueue, OffloadsAloneStayFifo) {
  JobQueue q;
  for (uint64_t h = 1; h <= 4; ++h) q.Push(Offload(h));
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(JobQueue, RunningOffloadsAreCappedPrefetchesAreNot) {
  JobQueue q;
  q.Push(Offload(1));
  q.Push(Offload(2));
  q.Push(Offload(3));
  auto a = q.Pop(2), b = q.Pop(2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(q.running_offloads(), 2u);
  EXPECT_FALSE(q.Pop(2).has_value()) << "a third offload ran beside two";
  q.Push(Prefetch(4));
  auto c = q.Pop(2);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->handle, 4u) << "the prefetch waited for a free offload slot";
  q.Done(*c);
  q.Done(*a);
  EXPECT_EQ(q.running_offloads(), 1u);
  auto d = q.Pop(2);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->handle, 3u);
  q.Done(*b);
  q.Done(*d);
  EXPECT_EQ(q.running_offloads(), 0u);
  EXPECT_EQ(q.outstanding(), 0u);
  EXPECT_TRUE(q.empty());
}

TEST(JobQueue, CancelledJobsLeaveTheCounts) {
  JobQueue q;
  q.Push(Offload(1));
  q.Push(Prefetch(2));
  q.Push(Offload(3));
  EXPECT_EQ(q.RemoveIf([](const Job& j) { return j.kind == JobKind::kPrefetch || j.handle == 3; }),
            2u);
  EXPECT_EQ(q.outstanding(), 1u);
  EXPECT_EQ(q.prefetch_in_flight(), 0u);
  EXPECT_EQ(q.running_offloads(), 0u);
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{1}));
}

constexpr uint64_t kMiB = 1 << 20;

tm_tensor Make(tm_runtime rt, const std::string& name, uint64_t bytes, tm_tier home) {
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = bytes;
  d.home_tier = home;
  d.name = name.c_str();
  tm_tensor t{};
  EXPECT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << tm_last_error();
  std::vector<uint8_t> data = testing::RandomBytes(bytes, static_cast<int>(name.size()));
  EXPECT_EQ(tm_tensor_write(rt, t, 0, data.data(), bytes), TM_OK) << tm_last_error();
  return t;
}

uint32_t Residency(tm_runtime rt, tm_tensor t) {
  uint32_t mask = 0;
  EXPECT_EQ(tm_tensor_residency(rt, t, &mask), TM_OK);
  return mask;
}

// Twelve offloads (1 MiB each, HBM to DRAM) are queued and the copies of those that run are
// held by the gate, so none finishes; then an offload to NVMe of x, which the schedule uses
// first. At the step's start, x's offload is dropped (x is needed within the depth) and its
// prefetch into HBM runs on the mover thread kept free, not after the twelve: x lands while every
// offload is still held. (In order, x's prefetch would wait for the held offloads, and the gate
// would give up first.)
TEST(JobQueueRuntime, ScheduledPrefetchPassesQueuedOffloads) {
  const char* device = std::getenv("TIERMEM_TEST_DEVICE");
  if (device != nullptr && std::string(device) == "cuda") {
    GTEST_SKIP() << "holds the emulated device's copies (io/copy_gate.h)";
  }
  testing::TempDir dir;
  tm_config c = testing::SmallConfig(dir.path());
  c.prefetch_depth = 2;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK) << tm_last_error();
  tm_tensor x = Make(rt, "x", 4096, TM_TIER_DRAM);
  ASSERT_EQ(Residency(rt, x), TM_TIER_BIT(TM_TIER_DRAM));
  ASSERT_EQ(tm_schedule_set(rt, &x, nullptr, 1), TM_OK) << tm_last_error();
  std::vector<tm_tensor> slow;
  for (int i = 0; i < 12; ++i)
    slow.push_back(Make(rt, "slow" + std::to_string(i), kMiB, TM_TIER_HBM));
  io::CopyGate offloads(
      io::CopyGate::Match().Of(io::CopyDirection::kDeviceToHost).AtLeast(kMiB).Copies(12));
  for (tm_tensor t : slow)
    ASSERT_EQ(tm_tensor_offload(rt, t, TM_TIER_DRAM), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_tensor_offload(rt, x, TM_TIER_NVME), TM_OK) << tm_last_error();
  // Three mover threads run offloads (one stays free for prefetches): each holds its copy.
  ASSERT_TRUE(offloads.WaitHeld(3));
  ASSERT_EQ(tm_step_begin(rt), TM_OK);
  ASSERT_EQ(tm_tensor_sync(rt, x), TM_OK) << tm_last_error();  // its prefetch has run
  EXPECT_FALSE(offloads.expired()) << "x's prefetch waited behind the offloads";
  EXPECT_NE(Residency(rt, x) & TM_TIER_BIT(TM_TIER_HBM), 0u) << "x was never prefetched";
  int offloaded = 0;  // slow tensors already in DRAM when x reached HBM
  for (tm_tensor t : slow) offloaded += (Residency(rt, t) & TM_TIER_BIT(TM_TIER_DRAM)) != 0;
  EXPECT_EQ(offloaded, 0);
  offloads.Open();
  ASSERT_EQ(tm_step_end(rt), TM_OK);
  ASSERT_EQ(tm_runtime_sync(rt), TM_OK) << tm_last_error();
  tm_stats s = TM_STATS_INIT;
  ASSERT_EQ(tm_runtime_stats(rt, &s), TM_OK);
  EXPECT_EQ(s.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME], 0u)
      << "x was written to NVMe although the schedule uses it first";
  EXPECT_EQ(Residency(rt, x) & TM_TIER_BIT(TM_TIER_NVME), 0u);
  for (tm_tensor t : slow) EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_DRAM));
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// A fence that passes when the test says so.
class TestFence : public io::Fence {
 public:
  absl::Status Wait() override {
    while (!passed_) std::this_thread::yield();
    return absl::OkStatus();
  }
  bool Passed() override { return passed_; }
  std::atomic<bool> passed_{false};
};

TEST(LinkOrder, EachCopyStartsAfterTheOneBeforeItUntilThatPassed) {
  using Fences = std::vector<io::FencePtr>;
  LinkOrder order;
  EXPECT_EQ(order.Enter(5), Fences{}) << "nothing in flight";
  auto first = std::make_shared<TestFence>();
  order.Leave(first);
  EXPECT_EQ(order.Enter(6), Fences{first}) << "the copy before is still on the link";
  order.Leave(nullptr);  // could not be enqueued: the one before stays the last
  EXPECT_EQ(order.Enter(7), Fences{first});
  first->passed_ = true;
  order.Leave(nullptr);
  EXPECT_EQ(order.Enter(8), Fences{}) << "passed: no wait on the device";
  order.Leave(nullptr);
}

TEST(LinkOrder, PrefetchesStartAfterAnUrgentCopyUntilItPassed) {
  using Fences = std::vector<io::FencePtr>;
  LinkOrder order;
  auto before = std::make_shared<TestFence>();
  (void)order.Enter(3);
  order.Leave(before);
  auto demand = std::make_shared<TestFence>();
  order.Urgent(demand);  // a use waits for it: it should have the link to itself
  EXPECT_EQ(order.Enter(4), (Fences{demand, before}));
  order.Leave(nullptr);
  demand->passed_ = true;
  before->passed_ = true;
  EXPECT_EQ(order.Enter(5), Fences{}) << "both passed: no wait on the device";
  order.Leave(nullptr);
}

// A prefetch that would enter between an urgent copy's enqueue and its Urgent (the demand's
// thread has not yet handed the fence over) waits for that fence instead of missing it.
TEST(LinkOrder, APrefetchWaitsForTheFenceOfAnUrgentCopyBeingEnqueued) {
  using Fences = std::vector<io::FencePtr>;
  LinkOrder order;
  order.UrgentComing();
  std::atomic<bool> entered{false};
  Fences after;
  std::thread prefetch([&] {
    after = order.Enter(3);
    entered = true;
    order.Leave(nullptr);
  });
  while (order.waiting() < 1 && !entered) std::this_thread::yield();  // waits in Enter, or went
  EXPECT_FALSE(entered.load()) << "a prefetch entered while an urgent copy was being enqueued";
  auto demand = std::make_shared<TestFence>();
  order.Urgent(demand);
  prefetch.join();
  EXPECT_EQ(after, Fences{demand});
  demand->passed_ = true;
}

TEST(LinkOrder, TheEarliestUseGoesFirst) {
  LinkOrder order;
  (void)order.Enter(1);  // a prefetch enqueuing: the others wait for their turn
  std::vector<uint64_t> went;
  Mutex mu;
  std::vector<std::thread> waiting;
  for (uint64_t position : {9, 4, 6}) {
    waiting.emplace_back([&, position] {
      (void)order.Enter(position);
      {
        MutexLock lock(&mu);
        went.push_back(position);
      }
      order.Leave(nullptr);
    });
  }
  while (order.waiting() < 3) std::this_thread::yield();  // all three in Enter
  {
    MutexLock lock(&mu);
    EXPECT_TRUE(went.empty()) << "a turn was taken while another prefetch enqueued";
  }
  order.Leave(nullptr);
  for (auto& t : waiting) t.join();
  EXPECT_EQ(went, (std::vector<uint64_t>{4, 6, 9}));
}

}  // namespace
}  // namespace tiermem
