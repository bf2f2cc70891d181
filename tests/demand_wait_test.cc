// Demands that wait: a request waiting for another thread's move of its tensor holds no other
// request for room, and an asynchronous offload whose room a held copy splits waits for the
// release (or, synced meanwhile, fails naming the copy in the way).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "io/copy_gate.h"
#include "lib/runtime/runtime.h"
#include "pressure_api.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::NewTensor;
using testing::PressureApi;
using testing::RandomBytes;

constexpr uint64_t kMiB = 1 << 20;

// A request that waits for another thread's move of its tensor does not hold the room token
// meanwhile: a second thread's request for room goes ahead. Here the prefetch of `a` is held by a
// copy gate, one thread's acquire of `a` waits for it (MoveWaits counts it), and the main
// thread's write-acquire of a fresh tensor (which takes the token) must return while the
// prefetch is still held; waiting, it would return only when the gate gives up.
TEST_F(PressureApi, WaitingForATensorsMoveHoldsNoOtherRequestForRoom) {
  ConfigOverrides o = testing::Emulated(dir_.path(), 32 * kMiB, 96 * kMiB, 256 * kMiB);
  o.prefetch_depth = 0;
  auto rt = testing::MakeRuntime(o);
  ASSERT_NE(rt, nullptr);
  const uint64_t a = NewTensor(*rt, "a", 8 * kMiB, TM_TIER_DRAM);
  const auto as = RandomBytes(8 * kMiB, 31);
  ASSERT_TRUE(rt->Write(a, 0, as.data(), as.size()).ok());
  io::CopyGate gate(io::CopyGate::Match().Of(io::CopyDirection::kHostToDevice).AtLeast(8 * kMiB));
  ASSERT_TRUE(rt->Prefetch(a, TM_TIER_HBM).ok());
  ASSERT_TRUE(gate.WaitHeld()) << "the prefetch of a never started";
  const uint64_t waits = rt->MoveWaits();
  std::atomic<bool> a_acquired{false};
  std::thread reader([&] {
    auto p = rt->Acquire(a, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    EXPECT_TRUE(p.ok()) << p.status();
    a_acquired = true;
    if (!p.ok()) return;
    EXPECT_EQ(std::memcmp(*p, as.data(), as.size()), 0);
    EXPECT_TRUE(rt->Release(a, TM_TIER_HBM).ok());
  });
  EXPECT_TRUE(testing::WaitUntil([&] { return rt->MoveWaits() > waits; }))
      << "the reader never waited for the move of a";
  const uint64_t fresh = NewTensor(*rt, "fresh", 8 * kMiB, TM_TIER_BY_PLACEMENT);
  auto w = rt->Acquire(fresh, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(gate.expired()) << "the write-acquire waited for the move of another tensor";
  EXPECT_FALSE(a_acquired.load());
  std::memset(*w, 3, 8 * kMiB);
  ASSERT_TRUE(rt->Release(fresh, TM_TIER_HBM).ok());
  gate.Open();
  reader.join();
  EXPECT_TRUE(a_acquired.load());
  ASSERT_TRUE(rt->SyncAll().ok());
}

// An asynchronous offload finds its tier's free bytes split by a copy a caller holds for a
// moment: it waits for the release and then runs. It failed at once, and the failure came back
// from the tensor's sync (or tm_step_end, which a framework treats as fatal) though the room was
// there a moment later. A sync while the copy is still held runs the offload on the caller's
// thread, where no room is the error, and the tensor stays whole where it was.
TEST_F(PressureApi, OffloadSplitByAHeldCopyWaitsForItsRelease) {
  enum { kReleased, kHeldAtTensorSync, kHeldAtRuntimeSync };
  for (int mode : {kReleased, kHeldAtTensorSync, kHeldAtRuntimeSync}) {
    SCOPED_TRACE(mode == kReleased           ? "released before the sync"
                 : mode == kHeldAtTensorSync ? "still held at tm_tensor_sync"
                                             : "still held at tm_runtime_sync");
    if (rt_.bits != 0) {
      ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
    }
    rt_ = {};
    Open(32 * kMiB, 8 * kMiB, 0);
    const uint64_t cap = Stats().tiers[TM_TIER_DRAM].capacity;
    const uint64_t half = cap / 2 / 4096 * 4096;
    ASSERT_GE(half, 2 * kMiB);
    // DRAM filled whole, `held` last into the hole the other two leave; then they go: two
    // holes, each short of x, the bytes enough.
    const std::vector<uint8_t> fill = RandomBytes(cap, 1);
    tm_tensor f = Make(half - kMiB, "f", TM_CLASS_OTHER, TM_TIER_DRAM);
    tm_tensor g = Make(cap - half, "g", TM_CLASS_OTHER, TM_TIER_DRAM);
    tm_tensor held = Make(kMiB, "held", TM_CLASS_OTHER, TM_TIER_DRAM);
    for (tm_tensor t : {f, g, held}) {
      uint64_t bytes = 0;
      ASSERT_EQ(tm_tensor_bytes(rt_, t, &bytes), TM_OK);
      ASSERT_EQ(tm_tensor_write(rt_, t, 0, fill.data(), bytes), TM_OK) << tm_last_error();
    }
    ASSERT_EQ(Stats().tiers[TM_TIER_DRAM].used, cap);
    ASSERT_EQ(tm_tensor_destroy(rt_, f), TM_OK);
    ASSERT_EQ(tm_tensor_destroy(rt_, g), TM_OK);
    const uint64_t n = cap - half + 4096;
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, held, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p), TM_OK);
    // The precondition: with `held` held, no hole of n bytes (whatever the placement did).
    tm_tensor probe = Make(n, "probe", TM_CLASS_OTHER, TM_TIER_DRAM);
    ASSERT_EQ(tm_tensor_acquire(rt_, probe, TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr, &p),
              TM_ERR_OUT_OF_MEMORY);
    ASSERT_EQ(tm_tensor_destroy(rt_, probe), TM_OK);

    tm_tensor x = Make(n, "x", TM_CLASS_OTHER, TM_TIER_HBM);
    const std::vector<uint8_t> bytes = RandomBytes(n, 2);
    ASSERT_EQ(tm_tensor_write(rt_, x, 0, bytes.data(), n), TM_OK) << tm_last_error();
    const tm_stats before = Stats();
    ASSERT_EQ(tm_tensor_offload(rt_, x, TM_TIER_DRAM), TM_OK) << tm_last_error();
    // The mover has tried it while `held` is held: parked (or, before, failed).
    ASSERT_TRUE(testing::WaitUntil([&] {
      const tm_stats now = Stats();
      return now.offloads_parked > before.offloads_parked || now.moves_failed > before.moves_failed;
    })) << "the mover never tried the offload";
    ASSERT_EQ(Stats().offloads_parked, before.offloads_parked + 1);
    ASSERT_EQ(Stats().moves_failed, before.moves_failed);
    if (mode == kReleased) {
      ASSERT_EQ(tm_tensor_release(rt_, held, TM_TIER_DRAM), TM_OK);
      EXPECT_EQ(tm_tensor_sync(rt_, x), TM_OK) << tm_last_error();
      uint32_t where = 0;
      ASSERT_EQ(tm_tensor_residency(rt_, x, &where), TM_OK);
      EXPECT_EQ(where, 1u << TM_TIER_DRAM) << "offloaded once the copy was let go";
    } else {
      EXPECT_EQ(mode == kHeldAtTensorSync ? tm_tensor_sync(rt_, x) : tm_runtime_sync(rt_),
                TM_ERR_OUT_OF_MEMORY);
      EXPECT_NE(std::string(tm_last_error()).find("\"held\""), std::string::npos)
          << "names the copy in the way: " << tm_last_error();
      ASSERT_EQ(tm_tensor_release(rt_, held, TM_TIER_DRAM), TM_OK);
      EXPECT_EQ(tm_runtime_sync(rt_), TM_OK) << "reported once, by the sync";
    }
    std::vector<uint8_t> back(n);
    ASSERT_EQ(tm_tensor_read(rt_, x, 0, back.data(), n), TM_OK) << tm_last_error();
    EXPECT_TRUE(back == bytes);
  }
}

}  // namespace
}  // namespace tiermem
