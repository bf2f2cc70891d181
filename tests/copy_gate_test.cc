// The test-only copy gate (io/copy_gate.h) on the emulated device's copy engine: a copy held at
// its start or at its completion until the gate opens, other copies passing it on its lane, the
// order in which held copies complete, and a gate that opens by itself when its patience is
// spent.
#include "io/copy_gate.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "io/device.h"

namespace tiermem::io {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class Gate : public ::testing::Test {
 protected:
  Gate() : device_(CreateEmulatedDevice({})), src_(8 * kMiB, 7), dst_(8 * kMiB, 0) {}
  CopyEngine& engine() { return device_->copy_engine(); }
  CopyTicket Enqueue(CopyDirection dir, uint64_t bytes, uint64_t offset = 0) {
    auto t = engine().Enqueue(dir, dst_.data() + offset, src_.data() + offset, bytes);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : CopyTicket{};
  }
  std::unique_ptr<Device> device_;
  std::vector<uint8_t> src_, dst_;
};

TEST_F(Gate, HoldsTheMatchingCopyAtItsStartUntilOpened) {
  CopyGate gate(CopyGate::Match().Of(CopyDirection::kHostToDevice).AtLeast(4 * kMiB));
  // Too small, and the other direction: not held.
  EXPECT_TRUE(engine().Wait(Enqueue(CopyDirection::kHostToDevice, kMiB)).ok());
  EXPECT_TRUE(engine().Wait(Enqueue(CopyDirection::kDeviceToHost, 4 * kMiB)).ok());
  EXPECT_EQ(gate.held(), 0);
  std::fill(dst_.begin(), dst_.end(), 0);
  const CopyTicket held = Enqueue(CopyDirection::kHostToDevice, 4 * kMiB);
  ASSERT_TRUE(gate.WaitHeld());
  // Set aside, not its lane: a later copy in the same direction goes past it.
  EXPECT_TRUE(engine().Wait(Enqueue(CopyDirection::kHostToDevice, kMiB, 4 * kMiB)).ok());
  EXPECT_FALSE(held.fence->Passed());
  EXPECT_EQ(dst_[0], 0) << "a copy held at its start copied bytes";
  // One copy only: the next matching one passes.
  EXPECT_TRUE(engine().Wait(Enqueue(CopyDirection::kHostToDevice, 4 * kMiB, 4 * kMiB)).ok());
  gate.Open();
  EXPECT_TRUE(engine().Wait(held).ok());
  EXPECT_EQ(dst_[0], 7);
  EXPECT_TRUE(gate.WaitCompleted(1));
  EXPECT_EQ(gate.completed(), std::vector<int>{0});
  EXPECT_FALSE(gate.expired());
}

TEST_F(Gate, HoldsTheCopyAtItsCompletionWithItsBytesCopied) {
  CopyGate gate(CopyGate::Match().At(CopyGate::Point::kCompletion));
  const CopyTicket held = Enqueue(CopyDirection::kDeviceToHost, 3 * kMiB + 5);
  ASSERT_TRUE(gate.WaitHeld());
  EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 3 * kMiB + 5), 0) << "its bytes are copied";
  EXPECT_FALSE(held.fence->Passed()) << "its fence passed while held";
  gate.Open();
  EXPECT_TRUE(engine().Wait(held).ok());
  EXPECT_TRUE(gate.WaitCompleted(1));
}

// Copies held together and let go together complete in the lane's order: a lane serves its
// copies slice by slice in turn, so the smaller of two copies released at once completes first.
TEST_F(Gate, RecordsTheOrderInWhichHeldCopiesComplete) {
  CopyGate gate(CopyGate::Match().Of(CopyDirection::kHostToDevice).Copies(2));
  const CopyTicket big = Enqueue(CopyDirection::kHostToDevice, 6 * kMiB);
  const CopyTicket small = Enqueue(CopyDirection::kHostToDevice, 2 * kMiB, 6 * kMiB);
  ASSERT_TRUE(gate.WaitHeld(2));
  gate.Open();
  EXPECT_TRUE(engine().Wait(big).ok());
  EXPECT_TRUE(engine().Wait(small).ok());
  ASSERT_TRUE(gate.WaitCompleted(2));
  EXPECT_EQ(gate.completed(), (std::vector<int>{1, 0}));
}

// A held copy that the test never lets go: the gate opens by itself and says so, instead of
// leaving the test hanging.
TEST_F(Gate, OpensByItselfWhenItsPatienceIsSpent) {
  CopyGate gate(CopyGate::Match().Patience(absl::Milliseconds(50)));
  const CopyTicket held = Enqueue(CopyDirection::kHostToHost, kMiB);
  EXPECT_TRUE(engine().Wait(held).ok());
  EXPECT_TRUE(gate.expired());
  EXPECT_FALSE(gate.WaitHeld(2)) << "an open gate holds nothing more";
}

// Gone, the gate lets its held copies go and holds nothing more; a new one may be made.
TEST_F(Gate, DestroyedGateLetsItsCopiesGo) {
  CopyTicket held;
  {
    CopyGate gate(CopyGate::Match{});
    held = Enqueue(CopyDirection::kHostToDevice, kMiB);
    ASSERT_TRUE(gate.WaitHeld());
  }
  EXPECT_TRUE(engine().Wait(held).ok());
  CopyGate next(CopyGate::Match().AtLeast(8 * kMiB));
  EXPECT_TRUE(engine().Wait(Enqueue(CopyDirection::kHostToDevice, kMiB)).ok());
  EXPECT_EQ(next.held(), 0);
}

}  // namespace
}  // namespace tiermem::io
