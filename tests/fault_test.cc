// Faults injected below the runtime (EIO, ENOSPC, short transfers, EAGAIN, io_uring refused):
// each reaches the caller with a clear status and message, the data stays valid where it was,
// and the runtime keeps working afterwards.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "io/fault_injection.h"
#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"

namespace tiermem {
namespace {

using testing::RandomBytes;
using testing::TempDir;

// Fails every completion of one direction with `err` while armed; or shortens, or refuses once.
class Injector : public io::FaultInjector {
 public:
  std::atomic<int> fail_errno{0};
  std::atomic<int> fail_writes{-1};  // 1: writes, 0: reads, -1: none
  std::atomic<bool> shorten{false};
  std::atomic<bool> eagain_every_other{false};
  std::atomic<bool> refuse_uring{false};
  std::atomic<int> calls{0};

  int OnCompletion(const io::IoRequest& r, uint64_t, uint64_t, int result) override {
    int n = calls++;
    if (fail_writes.load() == static_cast<int>(r.write)) return -fail_errno.load();
    if (eagain_every_other.load() && n % 2 == 0) return -EAGAIN;
    if (shorten.load() && result > 4096) return result / 2 / 4096 * 4096;
    return result;
  }
  bool FailUringSetup() override { return refuse_uring.load(); }
};

class Faults : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    io::SetFaultInjector(&injector_);
    rt_ = Make(GetParam());
    ASSERT_NE(rt_, nullptr);
  }
  void TearDown() override {
    rt_.reset();
    io::SetFaultInjector(nullptr);
  }
  std::unique_ptr<Runtime> Make(IoEngineKind engine, bool inclusive = false) {
    ConfigOverrides o = testing::Emulated(dir_.path(), 64ull << 20, 64ull << 20, 128ull << 20);
    o.io_engine = engine;
    o.io_block_size = 256 << 10;
    // Exclusive tiers unless asked: these faults strike NVMe itself, which inclusive DRAM's clean
    // copies would otherwise stand in for (tests/inclusive_test.cc covers those).
    return testing::MakeRuntime(o, {{"TIERMEM_DRAM_INCLUSIVE", inclusive ? "on" : "off"}});
  }
  uint64_t Tensor(uint64_t bytes, uint64_t seed, tm_tier where) {
    auto h = rt_->CreateTensor({bytes, TM_CLASS_PARAM, TM_TIER_HBM, "victim"});
    EXPECT_TRUE(h.ok());
    auto data = RandomBytes(bytes, seed);
    EXPECT_TRUE(rt_->Write(*h, 0, data.data(), bytes).ok());
    if (where != TM_TIER_HBM) {
      EXPECT_TRUE(rt_->Offload(*h, where).ok());
      EXPECT_TRUE(rt_->Sync(*h).ok());
    }
    return *h;
  }
  void ExpectContent(uint64_t h, uint64_t bytes, uint64_t seed) {
    std::vector<uint8_t> back(bytes);
    ASSERT_TRUE(rt_->Read(h, 0, back.data(), bytes).ok());
    EXPECT_TRUE(back == RandomBytes(bytes, seed)) << "content changed";
  }

  Injector injector_;
  TempDir dir_;
  std::unique_ptr<Runtime> rt_;
};

// What the C boundary makes of an exception (lib/api/c_boundary.h's Guarded): the system
// refusing a thread (a process at its thread limit, at tm_runtime_create or an optimizer's
// first step) is a resource, as host memory is, and says which limits apply; not a bug.
TEST(ExceptionStatus, ResourcesAreOutOfMemoryAndTheRestInternal) {
  auto status_of = [](auto thrower) {
    try {
      thrower();
    } catch (...) {
      return CurrentExceptionStatus();
    }
    return absl::OkStatus();
  };
  absl::Status s = status_of([] {
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            "thread");
  });
  EXPECT_EQ(ToTmStatus(s), TM_ERR_OUT_OF_MEMORY) << s;
  for (const char* named : {"would not start a thread", "ulimit -u", "pids.max"}) {
    EXPECT_NE(s.message().find(named), absl::string_view::npos) << s;
  }
  s = status_of([] { throw std::bad_alloc(); });
  EXPECT_EQ(ToTmStatus(s), TM_ERR_OUT_OF_MEMORY) << s;
  s = status_of(
      [] { throw std::system_error(std::make_error_code(std::errc::invalid_argument), "lock"); });
  EXPECT_EQ(ToTmStatus(s), TM_ERR_INTERNAL) << s;
  s = status_of([] { throw std::runtime_error("boom"); });
  EXPECT_EQ(ToTmStatus(s), TM_ERR_INTERNAL) << s;
  EXPECT_EQ(s.message(), "unexpected exception: boom");
  s = status_of([] { throw 42; });
  EXPECT_EQ(ToTmStatus(s), TM_ERR_INTERNAL) << s;
}

TEST_P(Faults, EioOnOffloadKeepsTheTensorWhereItWas) {
  const uint64_t n = (3 << 20) + 5;
  uint64_t h = Tensor(n, 1, TM_TIER_HBM);
  injector_.fail_errno = EIO;
  injector_.fail_writes = 1;
  ASSERT_TRUE(rt_->Offload(h, TM_TIER_NVME).ok()) << "queued at once";
  absl::Status s = rt_->Sync(h);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_IO) << s;
  EXPECT_NE(s.message().find("Input/output error"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("victim"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(dir_.path()), absl::string_view::npos) << s;
  // It says that it lost nothing, and counts as a failure that lost nothing.
  EXPECT_NE(s.message().find("left its tensor valid where it was: nothing was lost"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(rt_->Stats().moves_failed, 1u);
  EXPECT_EQ(rt_->Stats().moves_failed_lost, 0u);
  EXPECT_EQ(*rt_->Residency(h), TM_TIER_BIT(TM_TIER_HBM));
  EXPECT_TRUE(rt_->Sync(h).ok()) << "an error is reported once";
  EXPECT_EQ(rt_->Stats().tiers[TM_TIER_NVME].used, 0u) << "the failed destination was freed";
  ExpectContent(h, n, 1);
  // Healed: the same move goes through.
  injector_.fail_writes = -1;
  ASSERT_TRUE(rt_->Offload(h, TM_TIER_NVME).ok());
  ASSERT_TRUE(rt_->Sync(h).ok());
  EXPECT_EQ(*rt_->Residency(h), TM_TIER_BIT(TM_TIER_NVME));
  ExpectContent(h, n, 1);
}

// With inclusive DRAM the offload copies HBM to DRAM and frees HBM before it writes NVMe (so
// that the room is free sooner): a failed write leaves the tensor valid in DRAM, its bytes whole,
// the error reported, and nothing on NVMe.
TEST_P(Faults, EioOnInclusiveOffloadLeavesTheTensorValidInDram) {
  rt_ = Make(GetParam(), /*inclusive=*/true);
  ASSERT_NE(rt_, nullptr);
  const uint64_t n = (3 << 20) + 5;
  uint64_t h = Tensor(n, 2, TM_TIER_HBM);
  injector_.fail_errno = EIO;
  injector_.fail_writes = 1;
  ASSERT_TRUE(rt_->Offload(h, TM_TIER_NVME).ok()) << "queued at once";
  absl::Status s = rt_->Sync(h);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_IO) << s;
  EXPECT_NE(s.message().find("victim"), absl::string_view::npos) << s;
  EXPECT_EQ(*rt_->Residency(h), TM_TIER_BIT(TM_TIER_DRAM));
  EXPECT_EQ(rt_->Stats().tiers[TM_TIER_NVME].used, 0u) << "the failed destination was freed";
  ExpectContent(h, n, 2);
  injector_.fail_writes = -1;
  ASSERT_TRUE(rt_->Offload(h, TM_TIER_NVME).ok());
  ASSERT_TRUE(rt_->Sync(h).ok());
  EXPECT_NE(*rt_->Residency(h) & TM_TIER_BIT(TM_TIER_NVME), 0u);
  ExpectContent(h, n, 2);
}

TEST_P(Faults, EioOnAcquireFromNvme) {
  const uint64_t n = 2 << 20;
  uint64_t h = Tensor(n, 2, TM_TIER_NVME);
  injector_.fail_errno = EIO;
  injector_.fail_writes = 0;
  for (tm_tier tier : {TM_TIER_DRAM, TM_TIER_HBM}) {
    auto p = rt_->Acquire(h, tier, TM_ACCESS_READ, nullptr);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(ToTmStatus(p.status()), TM_ERR_IO) << p.status();
    EXPECT_EQ(*rt_->Residency(h), TM_TIER_BIT(TM_TIER_NVME));
  }
  tm_stats st = rt_->Stats();
  EXPECT_EQ(st.tiers[TM_TIER_HBM].used + st.tiers[TM_TIER_DRAM].used, 0u);
  // Prefetches fail too, and say so at sync.
  ASSERT_TRUE(rt_->Prefetch(h, TM_TIER_HBM).ok());
  EXPECT_EQ(ToTmStatus(rt_->SyncAll()), TM_ERR_IO);
  injector_.fail_writes = -1;
  ExpectContent(h, n, 2);
  auto p = rt_->Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(rt_->Release(h, TM_TIER_HBM).ok());
}

TEST_P(Faults, EnospcIsNoSpace) {
  const uint64_t n = 1 << 20;
  uint64_t h = Tensor(n, 3, TM_TIER_DRAM);
  injector_.fail_errno = ENOSPC;
  injector_.fail_writes = 1;
  ASSERT_TRUE(rt_->Offload(h, TM_TIER_NVME).ok());
  absl::Status s = rt_->Sync(h);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_NO_SPACE) << s;
  EXPECT_EQ(*rt_->Residency(h), TM_TIER_BIT(TM_TIER_DRAM));
  ExpectContent(h, n, 3);
}

TEST_P(Faults, WriteToNvmeFailingLeavesTheOldBytes) {
  const uint64_t n = (1 << 20) + 17;
  uint64_t h = Tensor(n, 4, TM_TIER_NVME);
  injector_.fail_errno = EIO;
  injector_.fail_writes = 1;
  auto patch = RandomBytes(1000, 5);
  absl::Status s = rt_->Write(h, 300000, patch.data(), patch.size());
  EXPECT_EQ(ToTmStatus(s), TM_ERR_IO) << s;
  injector_.fail_writes = -1;
  EXPECT_EQ(*rt_->Residency(h), TM_TIER_BIT(TM_TIER_NVME));
  ExpectContent(h, n, 4);  // not torn
  EXPECT_EQ(rt_->Stats().tiers[TM_TIER_NVME].used, rt_->Stats().tiers[TM_TIER_NVME].peak / 2)
      << "the fresh extent of the failed write was freed";
}

TEST_P(Faults, ShortTransfersAndEagainAreInvisible) {
  injector_.shorten = true;
  injector_.eagain_every_other = true;
  const uint64_t n = (5 << 20) + 3;
  uint64_t h = Tensor(n, 6, TM_TIER_NVME);
  auto p = rt_->Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(rt_->Release(h, TM_TIER_HBM).ok());
  ExpectContent(h, n, 6);
  EXPECT_GT(injector_.calls.load(), 40);
}

INSTANTIATE_TEST_SUITE_P(Both, Faults,
                         ::testing::Values(IoEngineKind::kUring, IoEngineKind::kPosix),
                         [](const auto& i) {
                           return i.param == IoEngineKind::kUring ? "uring" : "posix";
                         });

TEST(UringUnavailable, AutoFallsBackAndUringFails) {
  Injector injector;
  injector.refuse_uring = true;
  io::SetFaultInjector(&injector);
  TempDir dir;
  ConfigOverrides o;
  o.device = DeviceKind::kEmulated;
  o.hbm_bytes = o.dram_bytes = o.nvme_bytes = SizeSetting{16ull << 20, 0};
  o.nvme_paths = dir.path();
  auto none = [](const char*) -> std::optional<std::string> { return std::nullopt; };
  o.io_engine = IoEngineKind::kAuto;
  auto rt = Runtime::Create(*LoadConfig(o, none, {}));
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ((*rt)->info().io_engine, "posix");
  auto h = (*rt)->CreateTensor({4096, TM_CLASS_OTHER, TM_TIER_DRAM, "x"});
  char data[4096] = {7};
  ASSERT_TRUE((*rt)->Write(*h, 0, data, sizeof data).ok());
  ASSERT_TRUE((*rt)->Offload(*h, TM_TIER_NVME).ok());
  EXPECT_TRUE((*rt)->Sync(*h).ok()) << "the fallback engine works";
  o.io_engine = IoEngineKind::kUring;
  auto forced = Runtime::Create(*LoadConfig(o, none, {}));
  io::SetFaultInjector(nullptr);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(ToTmStatus(forced.status()), TM_ERR_UNSUPPORTED);
  EXPECT_NE(forced.status().message().find("TIERMEM_IO_ENGINE=uring"), absl::string_view::npos)
      << forced.status();
}

}  // namespace
}  // namespace tiermem
