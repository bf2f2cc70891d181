// Small scheduled prefetches up from DRAM, started on the acquiring thread (Moves::StartPrefetch)
// rather than by a mover: the acquire whose refill asks for one enqueues its copy before it
// returns, the copy lands for the acquire that uses it (which waits for it when it has not, or
// orders its stream after it), and the DRAM copy it reads stays in use until it has passed. A
// copy gate (io/copy_gate.h) holds the copy so that it is seen in flight.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "io/copy_gate.h"
#include "io/device.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"

namespace tiermem {
namespace {

using io::CopyGate;
using testing::NewTensor;
constexpr uint64_t kBytes = 256 << 10;  // small: started on the acquiring thread
constexpr int kTensors = 4;

class PrefetchStart : public ::testing::Test {
 protected:
  // w0..w3 in DRAM, scheduled in HBM in that order; depth 1: each acquire's refill asks for the
  // next. The step has begun and its first prefetch (queued for a mover) has landed.
  void SetUp() override {
    ConfigOverrides o = testing::Emulated(dir_.path(), 32ull << 20, 64ull << 20, 64ull << 20);
    o.prefetch_depth = 1;
    rt_ = testing::MakeRuntime(o);
    ASSERT_NE(rt_, nullptr);
    std::vector<Runtime::ScheduledUse> uses;
    for (int i = 0; i < kTensors; ++i) {
      const uint64_t h = NewTensor(*rt_, "w" + std::to_string(i), kBytes, TM_TIER_DRAM);
      const auto bytes = testing::RandomBytes(kBytes, i);
      ASSERT_TRUE(rt_->Write(h, 0, bytes.data(), kBytes).ok());
      w_.push_back(h);
      uses.push_back({h, TM_TIER_HBM});
    }
    ASSERT_TRUE(rt_->SetSchedule(uses).ok());
    ASSERT_TRUE(rt_->StepBegin().ok());
    ASSERT_TRUE(rt_->SyncAll().ok());
  }
  // Acquires w[i] in HBM, checks its bytes, releases it.
  void Use(int i) {
    auto p = rt_->Acquire(w_[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    ASSERT_TRUE(p.ok()) << p.status();
    const auto want = testing::RandomBytes(kBytes, i);
    EXPECT_EQ(std::memcmp(*p, want.data(), kBytes), 0) << "w" << i << " read wrong bytes";
    ASSERT_TRUE(rt_->Release(w_[i], TM_TIER_HBM).ok());
  }
  // The DRAM block at `offset`: whether it is free.
  bool DramFreeAt(uint64_t offset) {
    for (const TierSpace::Block& b : rt_->Layout(TM_TIER_DRAM)) {
      if (offset >= b.offset && offset < b.offset + b.size) return b.free;
    }
    ADD_FAILURE() << "no DRAM block at " << offset;
    return false;
  }
  uint64_t DramOffsetOf(uint64_t handle) {
    for (const TierSpace::Block& b : rt_->Layout(TM_TIER_DRAM)) {
      if (b.owner == handle) return b.offset;
    }
    ADD_FAILURE() << "no DRAM block of the tensor";
    return 0;
  }

  testing::TempDir dir_;
  std::unique_ptr<Runtime> rt_;
  std::vector<uint64_t> w_;
};

TEST_F(PrefetchStart, TheAcquireEnqueuesTheNextCopyAndItsUseWaitsForIt) {
  CopyGate gate(CopyGate::Match().Of(io::CopyDirection::kHostToDevice).AtLeast(kBytes));
  const tm_stats before = rt_->Stats();
  Use(0);  // a hit (landed at set-up); its refill starts w1's copy before it returns
  ASSERT_TRUE(gate.WaitHeld()) << "w1's prefetch was never enqueued";
  EXPECT_EQ(rt_->Stats().prefetches, before.prefetches + 1);
  // w1's acquire finds its copy landing and waits for it: a hit, with the right bytes.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.Open();
  });
  Use(1);
  opener.join();
  const tm_stats after = rt_->Stats();
  EXPECT_EQ(after.acquire_hits - before.acquire_hits, 2u);
  EXPECT_EQ(after.acquire_misses, before.acquire_misses);
  EXPECT_EQ(
      after.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM] - before.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM],
      2 * kBytes)
      << "w1 and w2 (started by w1's acquire) once each";
  Use(2);
  Use(3);
  EXPECT_TRUE(rt_->StepEnd().ok());
}

// A read on a caller's stream of a copy still landing: the stream waits for the copy, the host
// does not (the acquire returns while the gate holds the copy; one that waited on the host would
// return only once the gate gave up).
TEST_F(PrefetchStart, AReadOnAStreamWaitsOnTheStreamNotTheHost) {
  CopyGate gate(CopyGate::Match()
                    .Of(io::CopyDirection::kHostToDevice)
                    .AtLeast(kBytes)
                    .Patience(absl::Seconds(5)));
  Use(0);
  ASSERT_TRUE(gate.WaitHeld()) << "w1's prefetch was never enqueued";
  io::EmulatedStream stream;
  const tm_stats before = rt_->Stats();
  auto p = rt_->Acquire(w_[1], TM_TIER_HBM, TM_ACCESS_READ, &stream);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(gate.expired()) << "the acquire waited for the copy on the host";
  EXPECT_TRUE(gate.completed().empty()) << "the copy landed before the acquire returned";
  std::vector<uint8_t> seen(kBytes);
  const char* at = static_cast<const char*>(*p);
  stream.Launch([&seen, at] { std::memcpy(seen.data(), at, kBytes); });
  gate.Open();
  stream.Synchronize();
  EXPECT_EQ(seen, testing::RandomBytes(kBytes, 1)) << "the stream read before the copy landed";
  ASSERT_TRUE(rt_->ReleaseOnStream(w_[1], TM_TIER_HBM, &stream).ok());
  stream.Synchronize();
  EXPECT_EQ(rt_->Stats().acquire_hits, before.acquire_hits + 1);
  Use(1);  // on the host now: the copy is there
  EXPECT_TRUE(rt_->StepEnd().ok());
}

// Freed while the copy reads it (here by a destroy; an eviction dropping a clean DRAM copy goes
// the same way), the DRAM copy's memory stays reserved until the copy has passed: a new tensor
// written there would otherwise change the bytes landing in HBM.
TEST_F(PrefetchStart, TheSourceStaysReservedWhileTheCopyReadsIt) {
  const uint64_t offset = DramOffsetOf(w_[1]);
  {
    CopyGate gate(CopyGate::Match().Of(io::CopyDirection::kHostToDevice).AtLeast(kBytes));
    Use(0);
    ASSERT_TRUE(gate.WaitHeld());
    ASSERT_TRUE(rt_->DestroyTensor(w_[1]).ok());
    EXPECT_FALSE(DramFreeAt(offset)) << "the source of a copy in flight was freed";
    gate.Open();
    ASSERT_TRUE(gate.WaitCompleted(1));
  }
  EXPECT_TRUE(rt_->StepEnd().ok());  // reaps the deferred frees whose copies have passed
  EXPECT_TRUE(DramFreeAt(offset)) << "freed only once the copy had passed";
}

}  // namespace
}  // namespace tiermem
