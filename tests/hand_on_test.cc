// HBM handed on behind a copy down (TIERMEM_HBM_HAND_ON, lib/runtime/vacate.cc): a copy from HBM
// to DRAM whose HBM copy goes after it frees that memory once its pieces are enqueued, each
// part fenced by the piece still reading it. A move up into that memory follows the copy down
// piece by piece, and anything else that writes there waits: no byte of the tensor going down
// is lost, and the one coming up arrives whole.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/device.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::NewTensor;
using testing::RandomBytes;
using testing::ReadAll;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;
// A slow link, so that a copy of 8 MiB takes about 40 ms each way: a writer that did not wait
// for the copy down would overwrite its source long before it was read.
constexpr double kLinkGbps = 0.2;

std::unique_ptr<Runtime> MakeRuntime(const std::string& dir, bool hand_on) {
  // HBM: room for one tensor of 8 MiB.
  ConfigOverrides o = testing::Emulated(dir, 10 * kMiB, 64 * kMiB, 64 * kMiB);
  o.emu_link_gbps = kLinkGbps;
  o.prefetch_depth = 0;
  o.log_level = LogLevel::kError;
  auto rt = testing::MakeRuntime(o, {{"TIERMEM_HBM_HAND_ON", hand_on ? "on" : "off"}});
  if (rt != nullptr) {
    EXPECT_EQ(rt->config().hbm_hand_on, hand_on);
  }
  return rt;
}

// `a` (8 MiB) written in HBM, its only copy; `b` (8 MiB) written in DRAM.
struct TwoTensors {
  uint64_t a = 0, b = 0;
  std::vector<uint8_t> a_bytes = RandomBytes(8 * kMiB, 1), b_bytes = RandomBytes(8 * kMiB, 2);
};

TwoTensors Written(Runtime& rt) {
  TwoTensors t;
  t.a = NewTensor(rt, "a", 8 * kMiB, TM_TIER_HBM);
  t.b = NewTensor(rt, "b", 8 * kMiB, TM_TIER_DRAM);
  EXPECT_TRUE(rt.Write(t.a, 0, t.a_bytes.data(), t.a_bytes.size()).ok());
  EXPECT_TRUE(rt.Write(t.b, 0, t.b_bytes.data(), t.b_bytes.size()).ok());
  EXPECT_EQ(*rt.Residency(t.a), TM_TIER_BIT(TM_TIER_HBM));
  return t;
}

TEST(HandOn, AMoveUpFollowsTheCopyDownItMakesRoomFor) {
  TempDir dir;
  for (bool hand_on : {true, false}) {
    SCOPED_TRACE(hand_on ? "handed on" : "off");
    auto rt = MakeRuntime(dir.path(), hand_on);
    ASSERT_NE(rt, nullptr);
    TwoTensors t = Written(*rt);
    const tm_stats before = rt->Stats();
    // b's acquire needs a's room: a goes down to DRAM (an eviction's write-down) and b comes up
    // into the memory a's copy down is leaving.
    auto p = rt->Acquire(t.b, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(std::memcmp(*p, t.b_bytes.data(), t.b_bytes.size()), 0);
    ASSERT_TRUE(rt->Release(t.b, TM_TIER_HBM).ok());
    const tm_stats after = rt->Stats();
    EXPECT_EQ(after.evictions, before.evictions + 1);
    EXPECT_EQ(after.hbm_handed_on, before.hbm_handed_on + (hand_on ? 1 : 0));
    EXPECT_EQ(after.hbm_handed_on_bytes, before.hbm_handed_on_bytes + (hand_on ? 8 * kMiB : 0));
    EXPECT_EQ(after.moves_behind, before.moves_behind + (hand_on ? 1 : 0));
    EXPECT_EQ(after.moves_behind_bytes, before.moves_behind_bytes + (hand_on ? 8 * kMiB : 0));
    EXPECT_EQ(*rt->Residency(t.a), TM_TIER_BIT(TM_TIER_DRAM));
    EXPECT_EQ(ReadAll(*rt, t.a, t.a_bytes.size()), t.a_bytes);
    ASSERT_TRUE(rt->SyncAll().ok());
  }
}

TEST(HandOn, AnOffloadHandsItsMemoryToTheAcquireWaitingForIt) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), true);
  ASSERT_NE(rt, nullptr);
  TwoTensors t = Written(*rt);
  const tm_stats before = rt->Stats();
  ASSERT_TRUE(rt->Offload(t.a, TM_TIER_DRAM).ok());  // queued: a mover copies a down
  auto p = rt->Acquire(t.b, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(std::memcmp(*p, t.b_bytes.data(), t.b_bytes.size()), 0);
  ASSERT_TRUE(rt->Release(t.b, TM_TIER_HBM).ok());
  ASSERT_TRUE(rt->Sync(t.a).ok());
  const tm_stats after = rt->Stats();
  // Handed on by the offload, or (when the acquire came first) by the eviction it made.
  EXPECT_EQ(after.hbm_handed_on, before.hbm_handed_on + 1);
  EXPECT_EQ(after.moves_behind, before.moves_behind + 1);
  EXPECT_EQ(*rt->Residency(t.a), TM_TIER_BIT(TM_TIER_DRAM));
  EXPECT_EQ(ReadAll(*rt, t.a, t.a_bytes.size()), t.a_bytes);
}

TEST(HandOn, AWriterOfTheMemoryWaitsForTheCopyDownStillReadingIt) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), true);
  ASSERT_NE(rt, nullptr);
  TwoTensors t = Written(*rt);
  // c is new: an acquire for writing reserves HBM, a's room, and hands the pointer out. The
  // caller writes at once, from the host: by then a's copy down must have read every byte.
  const uint64_t c = NewTensor(*rt, "c", 8 * kMiB, TM_TIER_HBM);
  auto p = rt->Acquire(c, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 0xab, 8 * kMiB);
  ASSERT_TRUE(rt->Release(c, TM_TIER_HBM).ok());
  EXPECT_EQ(rt->Stats().hbm_handed_on, 1u);
  EXPECT_EQ(ReadAll(*rt, t.a, t.a_bytes.size()), t.a_bytes);
  EXPECT_EQ(ReadAll(*rt, c, 8 * kMiB), std::vector<uint8_t>(8 * kMiB, 0xab));
}

TEST(HandOn, AStreamWritingTheMemoryWaitsForTheCopyDown) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), true);
  ASSERT_NE(rt, nullptr);
  TwoTensors t = Written(*rt);
  const uint64_t c = NewTensor(*rt, "c", 8 * kMiB, TM_TIER_HBM);
  io::EmulatedStream stream;
  auto p = rt->Acquire(c, TM_TIER_HBM, TM_ACCESS_WRITE, &stream);
  ASSERT_TRUE(p.ok()) << p.status();
  // The caller's kernel, in the stream's order: after what the acquire made the stream wait for.
  void* dst = *p;
  stream.Launch([dst] { std::memset(dst, 0xcd, 8 * kMiB); });
  ASSERT_TRUE(rt->ReleaseOnStream(c, TM_TIER_HBM, &stream).ok());
  stream.Synchronize();
  EXPECT_EQ(rt->Stats().hbm_handed_on, 1u);
  EXPECT_EQ(ReadAll(*rt, t.a, t.a_bytes.size()), t.a_bytes);
  EXPECT_EQ(ReadAll(*rt, c, 8 * kMiB), std::vector<uint8_t>(8 * kMiB, 0xcd));
}

TEST(HandOn, AnEvictionsCopyStillLandingIsNoCallersCopy) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), true);
  ASSERT_NE(rt, nullptr);
  TwoTensors t = Written(*rt);
  const uint64_t d = NewTensor(*rt, "d", 8 * kMiB, TM_TIER_DRAM);
  const std::vector<uint8_t> d_bytes = RandomBytes(8 * kMiB, 3);
  ASSERT_TRUE(rt->Write(d, 0, d_bytes.data(), d_bytes.size()).ok());
  // b's acquire evicts a; a's copy down is not waited for: its DRAM copy lands.
  ASSERT_TRUE(rt->Acquire(t.b, TM_TIER_HBM, TM_ACCESS_READ, nullptr).ok());
  ASSERT_TRUE(rt->Release(t.b, TM_TIER_HBM).ok());
  EXPECT_EQ(rt->Stats().hbm_handed_on, 1u);
  // No copy between a and a caller's memory is in flight, and a swap waits for tiermem's own.
  auto done = rt->CopyDone(t.a);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  ASSERT_TRUE(rt->SwapContents({{t.a, d}}).ok());
  EXPECT_EQ(ReadAll(*rt, t.a, 8 * kMiB), d_bytes);
  EXPECT_EQ(ReadAll(*rt, d, 8 * kMiB), t.a_bytes);
}

}  // namespace
}  // namespace tiermem
