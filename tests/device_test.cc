// The emulated device as a device: its copies are bit-exact and asynchronous, a link cap holds,
// and TimeCopies (what tiermem-probe's copy rows use) reports each copy's time under the cap.
#include "io/device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace tiermem {
namespace {

using Kind = io::Device::CopyKind;

TEST(EmulatedDevice, TimeCopiesRespectsTheLinkCap) {
  // 2 GB/s: 16 MiB take at least 8.4 ms on the link, however fast memcpy is.
  auto dev = io::CreateEmulatedDevice({64ull << 20, 2.0});
  const uint64_t n = 16 << 20;
  auto slab = dev->AllocateSlab(n);
  ASSERT_TRUE(slab.ok()) << slab.status();
  auto data = testing::RandomBytes(n, 4);
  std::vector<uint8_t> back(n);
  for (Kind k : {Kind::kHostToDevice, Kind::kDeviceToHost}) {
    auto t = k == Kind::kHostToDevice ? dev->TimeCopies(k, *slab, data.data(), n, 3)
                                      : dev->TimeCopies(k, back.data(), *slab, n, 3);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->size(), 3u);
    for (double s : *t) {
      // The link clock may lag by its 0.5 ms of slack, no more.
      EXPECT_GE(s, static_cast<double>(n) / 2e9 - 0.6e-3) << "faster than the 2 GB/s cap";
    }
  }
  EXPECT_EQ(back, data);
  dev->FreeSlab(*slab, n);
}

TEST(EmulatedDevice, DeviceToDeviceIsNotOnTheLink) {
  auto dev = io::CreateEmulatedDevice({64ull << 20, 0.001});  // 1 MB/s: 16 MiB would take 17 s
  const uint64_t n = 16 << 20;
  auto a = dev->AllocateSlab(n);
  auto b = dev->AllocateSlab(n);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(dev->Fill(*a, 0x5c, n).ok());
  auto t = dev->TimeCopies(Kind::kDeviceToDevice, *b, *a, n, 2);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  for (double s : *t) EXPECT_LT(s, 5.0) << "a device-internal copy went over the capped link";
  EXPECT_EQ(static_cast<uint8_t*>(*b)[0], 0x5c);
  EXPECT_EQ(static_cast<uint8_t*>(*b)[n - 1], 0x5c);
  dev->FreeSlab(*a, n);
  dev->FreeSlab(*b, n);
}

TEST(EmulatedDevice, CopiesAreAsynchronous) {
  auto dev = io::CreateEmulatedDevice({64ull << 20, 1.0});  // 32 MiB: at least 33 ms
  const uint64_t n = 32 << 20;
  auto slab = dev->AllocateSlab(n);
  ASSERT_TRUE(slab.ok());
  auto data = testing::RandomBytes(n, 6);
  auto t0 = std::chrono::steady_clock::now();
  auto ticket = dev->copy_engine().Enqueue(io::CopyDirection::kHostToDevice, *slab, data.data(), n);
  const double enqueue_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(dev->copy_engine().Wait(*ticket).ok());
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(enqueue_s, total_s / 2) << "Enqueue waited for the copy";
  EXPECT_EQ(std::memcmp(*slab, data.data(), n), 0);
  dev->FreeSlab(*slab, n);
}

}  // namespace
}  // namespace tiermem
