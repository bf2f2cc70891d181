// Callers' streams on the emulated device (real asynchronous queues): a release on a stream
// keeps tiermem off the memory until the stream's work has passed, a stream-ordered acquire or
// copy waits for the stream's prior work without blocking the host, and bad or capturing
// streams are reported. The runtime is driven through its C++ API here, since the test's
// emulated streams must be the library's own (tests/copy_test.cc drives the C API).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "io/device.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"

namespace tiermem {
namespace {

using testing::NewTensor;

// The stream's first work waits at `shut_` until the test opens it: a call that returns
// meanwhile did not wait for the stream on the host (one that did would return only when the
// latch gives up, and the test then fails on expired()).
class Streams : public ::testing::Test {
 protected:
  // A runtime on the emulated device whose HBM tier holds `hbm` bytes.
  std::unique_ptr<Runtime> Make(uint64_t hbm, uint64_t dram = 64ull << 20) {
    ConfigOverrides o = testing::Emulated(dir_.path(), hbm, dram, 128ull << 20);
    o.prefetch_depth = 0;
    return testing::MakeRuntime(o);
  }
  // Queues `work` on the stream behind the shut latch.
  template <typename Work>
  void LaunchShut(Work work) {
    stream_.Launch([this, work] {
      shut_.Wait();
      work();
    });
  }
  // Opens the latch; false when it had already given up: the host waited for the stream.
  bool OpenedByTheTest() {
    shut_.Open();
    return !shut_.expired();
  }
  void TearDown() override { shut_.Open(); }  // a test that stopped early leaves nothing held
  testing::TempDir dir_;
  testing::Latch shut_;
  io::EmulatedStream stream_;
};

constexpr uint64_t kBytes = 4ull << 20;

// The stream's work writes the HBM copy after the release returned; the offload queued right
// after must move those bytes, not the ones before.
TEST_F(Streams, ReleaseOnStreamHoldsOffloadUntilTheStreamPasses) {
  auto rt = Make(16ull << 20);
  ASSERT_NE(rt, nullptr);
  const uint64_t t = NewTensor(*rt, "act", kBytes, TM_TIER_HBM);
  std::vector<uint8_t> before(kBytes, 0x11);
  ASSERT_TRUE(rt->Write(t, 0, before.data(), kBytes).ok());
  auto p = rt->Acquire(t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  char* hbm = static_cast<char*>(*p);
  LaunchShut([hbm] { std::memset(hbm, 0x5a, kBytes); });
  ASSERT_TRUE(rt->ReleaseOnStream(t, TM_TIER_HBM, &stream_).ok());
  ASSERT_TRUE(rt->Offload(t, TM_TIER_DRAM).ok());
  EXPECT_TRUE(OpenedByTheTest()) << "the host waited for the stream";
  ASSERT_TRUE(rt->Sync(t).ok());
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(rt->Read(t, 0, back.data(), kBytes).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(kBytes, 0x5a));
  auto mask = rt->Residency(t);
  EXPECT_EQ(*mask, TM_TIER_BIT(TM_TIER_DRAM));
}

// HBM holds one tensor. The stream reads the copy after its release; another tensor's write
// needs the room, so the copy is evicted (it is also in DRAM) and its extent refilled: that
// must wait until the stream has read what it released.
TEST_F(Streams, ReleaseOnStreamHoldsEvictionAndRefill) {
  auto rt = Make(kBytes);
  ASSERT_NE(rt, nullptr);
  const uint64_t a = NewTensor(*rt, "a", kBytes, TM_TIER_HBM);
  const uint64_t b = NewTensor(*rt, "b", kBytes, TM_TIER_HBM);
  auto a_bytes = testing::RandomBytes(kBytes, 1);
  auto b_bytes = testing::RandomBytes(kBytes, 2);
  ASSERT_TRUE(rt->Write(a, 0, a_bytes.data(), kBytes).ok());
  auto p = rt->Acquire(a, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  const char* hbm = static_cast<const char*>(*p);
  std::vector<uint8_t> seen(kBytes);
  std::atomic<bool> written{false}, written_before_read{false};
  LaunchShut([&] {
    written_before_read = written.load();
    std::memcpy(seen.data(), hbm, kBytes);
  });
  ASSERT_TRUE(rt->ReleaseOnStream(a, TM_TIER_HBM, &stream_).ok());
  // The write evicts a (written down first) and refills its extent, which must wait for the
  // stream: it runs on a thread of its own, since it returns only once the latch is open. (A
  // runtime that wrongly refilled at once is caught when the writer gets there before the stream
  // reads; the runtime gives no sign of a writer that waits, so no order between the two is
  // forced.)
  std::thread writer([&] {
    EXPECT_TRUE(rt->Write(b, 0, b_bytes.data(), kBytes).ok());
    written = true;
  });
  shut_.Open();
  writer.join();
  stream_.Synchronize();
  EXPECT_FALSE(written_before_read.load()) << "the refill did not wait for the stream";
  EXPECT_TRUE(seen == a_bytes) << "the stream read memory that was refilled under it";
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(rt->Read(a, 0, back.data(), kBytes).ok());
  EXPECT_TRUE(back == a_bytes);
  ASSERT_TRUE(rt->Read(b, 0, back.data(), kBytes).ok());
  EXPECT_TRUE(back == b_bytes);
}

// Destroying a tensor right after its release on a stream defers the free of its memory: the
// next tensor does not get it while the stream still reads it.
TEST_F(Streams, DestroyAfterReleaseOnStreamDefersTheFree) {
  auto rt = Make(kBytes);
  ASSERT_NE(rt, nullptr);
  const uint64_t a = NewTensor(*rt, "a", kBytes, TM_TIER_HBM);
  auto a_bytes = testing::RandomBytes(kBytes, 3);
  ASSERT_TRUE(rt->Write(a, 0, a_bytes.data(), kBytes).ok());
  auto p = rt->Acquire(a, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
  ASSERT_TRUE(p.ok());
  const char* hbm = static_cast<const char*>(*p);
  std::vector<uint8_t> seen(kBytes);
  LaunchShut([&seen, hbm] { std::memcpy(seen.data(), hbm, kBytes); });
  ASSERT_TRUE(rt->ReleaseOnStream(a, TM_TIER_HBM, &stream_).ok());
  ASSERT_TRUE(rt->DestroyTensor(a).ok());
  // While the stream has not read it, a's memory is still taken, though no tensor owns it.
  EXPECT_EQ(rt->Stats().tiers[TM_TIER_HBM].used, rt->Rounded(TM_TIER_HBM, kBytes));
  for (const auto& block : rt->Layout(TM_TIER_HBM)) {
    EXPECT_FALSE(block.free) << "the destroyed tensor's memory was freed under the stream";
  }
  EXPECT_TRUE(OpenedByTheTest()) << "destroy waited for the stream on the host";
  const uint64_t b = NewTensor(*rt, "b", kBytes, TM_TIER_HBM);
  std::vector<uint8_t> zeros(kBytes, 0xee);
  ASSERT_TRUE(rt->Write(b, 0, zeros.data(), kBytes).ok());  // waits for the deferred free
  stream_.Synchronize();
  EXPECT_TRUE(seen == a_bytes);
  EXPECT_EQ(rt->Stats().tiers[TM_TIER_HBM].used, rt->Rounded(TM_TIER_HBM, kBytes));
}

// The DRAM copy is written by the stream after its release; a stream-ordered acquire into HBM
// returns at once and its copy (read by the stream's next work) holds what the stream wrote.
TEST_F(Streams, StreamOrderedAcquireWaitsForTheStreamsPriorWork) {
  auto rt = Make(16ull << 20);
  ASSERT_NE(rt, nullptr);
  const uint64_t t = NewTensor(*rt, "w", kBytes, TM_TIER_DRAM);
  std::vector<uint8_t> old(kBytes, 0x01);
  ASSERT_TRUE(rt->Write(t, 0, old.data(), kBytes).ok());
  auto p = rt->Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr);
  ASSERT_TRUE(p.ok());
  char* dram = static_cast<char*>(*p);
  std::atomic<bool> written{false};
  LaunchShut([dram, &written] {
    std::memset(dram, 0x7c, kBytes);
    written = true;
  });
  ASSERT_TRUE(rt->ReleaseOnStream(t, TM_TIER_DRAM, &stream_).ok());
  auto h = rt->Acquire(t, TM_TIER_HBM, TM_ACCESS_READ, &stream_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_FALSE(written.load()) << "the stream's work ran before the latch opened";
  std::vector<uint8_t> seen(kBytes);
  const char* hbm = static_cast<const char*>(*h);
  stream_.Launch([&seen, hbm] { std::memcpy(seen.data(), hbm, kBytes); });
  ASSERT_TRUE(rt->ReleaseOnStream(t, TM_TIER_HBM, &stream_).ok());
  EXPECT_TRUE(OpenedByTheTest()) << "the host waited for the stream";
  stream_.Synchronize();
  EXPECT_TRUE(seen == std::vector<uint8_t>(kBytes, 0x7c));
  ASSERT_TRUE(rt->Sync(t).ok());
}

// copy_in from a buffer the stream fills first, copy_out into a buffer the stream reads after:
// the host enqueues both without waiting, and both see the stream's order.
TEST_F(Streams, CopyInAndOutAreOrderedOnTheStream) {
  auto rt = Make(16ull << 20);
  ASSERT_NE(rt, nullptr);
  const uint64_t t = NewTensor(*rt, "c", kBytes + 7, TM_TIER_DRAM);
  std::vector<uint8_t> src(kBytes + 7, 0), dst(kBytes + 7, 0), seen;
  auto pattern = testing::RandomBytes(kBytes + 7, 9);
  LaunchShut([&] { std::memcpy(src.data(), pattern.data(), pattern.size()); });
  ASSERT_TRUE(rt->CopyIn(t, 0, src.data(), src.size(), &stream_).ok());
  ASSERT_TRUE(rt->CopyOut(t, 0, dst.data(), dst.size(), &stream_).ok());
  stream_.Launch([&] { seen = dst; });
  EXPECT_TRUE(OpenedByTheTest()) << "the host waited for the stream";
  stream_.Synchronize();
  EXPECT_TRUE(seen == pattern);
  ASSERT_TRUE(rt->Sync(t).ok());
  EXPECT_EQ(rt->Stats().tiers[TM_TIER_HBM].used, 0u);
}

// A tensor destroyed while its copy_in still waits for the stream: destroy does not wait on the
// host, and the memory is not reused before the copy has landed.
TEST_F(Streams, DestroyDuringCopyInDoesNotWait) {
  auto rt = Make(16ull << 20, kBytes * 3 / 2);  // DRAM for one tensor (a quarter is staging)
  ASSERT_NE(rt, nullptr);
  const uint64_t t = NewTensor(*rt, "in-flight", kBytes, TM_TIER_DRAM);
  std::vector<uint8_t> src(kBytes, 0x42);
  LaunchShut([] {});
  ASSERT_TRUE(rt->CopyIn(t, 0, src.data(), kBytes, &stream_).ok());
  ASSERT_TRUE(rt->DestroyTensor(t).ok());
  // While the copy waits for the stream, the memory it lands in is still taken.
  EXPECT_GE(rt->Stats().tiers[TM_TIER_DRAM].used, rt->Rounded(TM_TIER_DRAM, kBytes))
      << "the destroyed tensor's memory was freed under its landing copy";
  EXPECT_TRUE(OpenedByTheTest()) << "destroy waited for the stream on the host";
  // The next tensor needs that DRAM: it waits for the landing copy, then gets it.
  const uint64_t u = NewTensor(*rt, "next", kBytes, TM_TIER_DRAM);
  std::vector<uint8_t> other(kBytes, 0x17), back(kBytes);
  ASSERT_TRUE(rt->Write(u, 0, other.data(), kBytes).ok());
  ASSERT_TRUE(rt->Read(u, 0, back.data(), kBytes).ok());
  EXPECT_EQ(back, other);
  stream_.Synchronize();
}

TEST_F(Streams, BadAndCapturingStreamsAreReported) {
  auto rt = Make(16ull << 20);
  ASSERT_NE(rt, nullptr);
  const uint64_t t = NewTensor(*rt, "s", 4096, TM_TIER_DRAM);
  std::vector<uint8_t> buf(4096, 3);
  ASSERT_TRUE(rt->Write(t, 0, buf.data(), buf.size()).ok());
  int not_a_stream = 0;
  void* bad = &not_a_stream;
  auto a = rt->Acquire(t, TM_TIER_HBM, TM_ACCESS_READ, bad);
  EXPECT_EQ(ToTmStatus(a.status()), TM_ERR_INVALID_ARGUMENT) << a.status();
  EXPECT_NE(a.status().message().find("not a live stream"), absl::string_view::npos);
  EXPECT_EQ(ToTmStatus(rt->CopyIn(t, 0, buf.data(), buf.size(), bad)), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ToTmStatus(rt->CopyOut(t, 0, buf.data(), buf.size(), bad)), TM_ERR_INVALID_ARGUMENT);
  auto p = rt->Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ToTmStatus(rt->ReleaseOnStream(t, TM_TIER_DRAM, bad)), TM_ERR_INVALID_ARGUMENT);
  // Refused: the pin is still held, and a release with a good stream takes it.
  EXPECT_EQ(ToTmStatus(rt->DestroyTensor(t)), TM_ERR_BUSY);
  stream_.SetCapturing(true);
  EXPECT_EQ(ToTmStatus(rt->ReleaseOnStream(t, TM_TIER_DRAM, &stream_)), TM_ERR_UNSUPPORTED);
  EXPECT_EQ(ToTmStatus(rt->CopyIn(t, 0, buf.data(), buf.size(), &stream_)), TM_ERR_UNSUPPORTED);
  stream_.SetCapturing(false);
  ASSERT_TRUE(rt->ReleaseOnStream(t, TM_TIER_DRAM, &stream_).ok());
  // cudaStreamLegacy names the emulated device's default stream.
  ASSERT_TRUE(rt->CopyOut(t, 0, buf.data(), buf.size(), reinterpret_cast<void*>(0x1)).ok());
  ASSERT_TRUE(rt->Sync(t).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(4096, 3));
  ASSERT_TRUE(rt->DestroyTensor(t).ok());
}

}  // namespace
}  // namespace tiermem
