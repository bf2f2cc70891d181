// Budget exhaustion, full disks and pinned tensors give their errors, the data stays readable,
// and the runtime keeps working afterwards.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "json_check.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

// Exclusive tiers (TIERMEM_DRAM_INCLUSIVE=off) for every runtime of this file: its tests reach
// NVMe itself, for which inclusive DRAM's clean copies would stand in (tests/inclusive_test.cc).
static const tiermem::testing::ScopedEnv kExclusiveTiers("TIERMEM_DRAM_INCLUSIVE", "off");

namespace tiermem {
namespace {

using testing::OffloadNow;
using testing::RandomBytes;
using testing::SmallConfig;
using testing::TempDir;

class Errors : public ::testing::Test {
 protected:
  static constexpr uint64_t kBig = 16 << 20;  // two thirds of HBM and of DRAM, a quarter of NVMe
  void SetUp() override {
    // A quarter of SmallConfig's budgets (HBM 24 MiB, DRAM 24 MiB, NVMe 64 MiB), filled by
    // tensors of kBig bytes: the same layouts at a quarter of the bytes to write and check.
    tm_config cfg = SmallConfig(dir_.path());
    cfg.hbm_bytes = 24ull << 20;
    cfg.dram_bytes = 24ull << 20;
    cfg.nvme_bytes = 4 * kBig;
    ASSERT_EQ(tm_runtime_create(&cfg, &rt_), TM_OK) << tm_last_error();
  }
  void TearDown() override { EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK); }

  tm_tensor Make(uint64_t bytes, const char* name, uint64_t seed) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.name = name;
    tm_tensor t{};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    auto data = RandomBytes(bytes, seed);
    EXPECT_EQ(tm_tensor_write(rt_, t, 0, data.data(), bytes), TM_OK) << tm_last_error();
    return t;
  }
  // The NVMe tier filled: four tensors of kBig ("fill", seeds 10 to 13) offloaded there.
  std::vector<tm_tensor> FillNvme() {
    std::vector<tm_tensor> ts;
    for (int i = 0; i < 4; ++i) {
      ts.push_back(Make(kBig, "fill", 10 + i));
      EXPECT_EQ(OffloadNow(rt_, ts.back(), TM_TIER_NVME), TM_OK) << tm_last_error();
    }
    return ts;
  }
  void ExpectContent(tm_tensor t, uint64_t bytes, uint64_t seed) {
    std::vector<uint8_t> back(bytes);
    ASSERT_EQ(tm_tensor_read(rt_, t, 0, back.data(), bytes), TM_OK) << tm_last_error();
    EXPECT_TRUE(back == RandomBytes(bytes, seed)) << "content changed";
  }
  uint32_t Residency(tm_tensor t) {
    uint32_t m = 0;
    EXPECT_EQ(tm_tensor_residency(rt_, t, &m), TM_OK);
    return m;
  }

  TempDir dir_;
  tm_runtime rt_{};
};

TEST_F(Errors, HbmBudgetExhaustedWithEverythingPinned) {
  tm_tensor a = Make(kBig, "a", 1);
  void* pa = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &pa));
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = kBig;
  d.name = "b";
  tm_tensor b;
  TM_ASSERT_OK(tm_tensor_create(rt_, &d, &b));
  auto data = RandomBytes(kBig, 2);
  ASSERT_EQ(tm_tensor_write(rt_, b, 0, data.data(), data.size()), TM_ERR_OUT_OF_MEMORY);
  std::string msg = tm_last_error();
  EXPECT_NE(msg.find("hbm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"b\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("acquired"), std::string::npos) << msg;
  void* p = nullptr;
  EXPECT_EQ(tm_tensor_acquire(rt_, b, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p),
            TM_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(Residency(b), 0u);
  ExpectContent(a, kBig, 1);
  // Released, `a` can be evicted (written down to DRAM: it is its only copy).
  TM_ASSERT_OK(tm_tensor_release(rt_, a, TM_TIER_HBM));
  TM_ASSERT_OK(tm_tensor_write(rt_, b, 0, data.data(), data.size()));
  EXPECT_EQ(Residency(a), TM_TIER_BIT(TM_TIER_DRAM));
  ExpectContent(a, kBig, 1);
  ExpectContent(b, kBig, 2);
  tm_stats st = TM_STATS_INIT;
  TM_ASSERT_OK(tm_runtime_stats(rt_, &st));
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.eviction_bytes, kBig);
}

// A tensor larger than the whole HBM tier: one sentence naming what it needs and what the tier
// holds. It read doubled ("... can never fit: the hbm tier is full: ... needs 40 MiB; ...").
TEST_F(Errors, TensorLargerThanTheTierSaysSoOnce) {
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 40ull << 20;
  d.name = "huge";
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt_, &d, &t));
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p),
            TM_ERR_OUT_OF_MEMORY);
  const std::string msg = tm_last_error();
  EXPECT_NE(msg.find("tensor \"huge\" needs 40 MiB, more than the whole hbm tier (24 MiB)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("is full"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("mapped"), std::string::npos) << "the slab layout has no chunks: " << msg;
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

TEST_F(Errors, DramBudgetExhaustedOnOffload) {
  tm_tensor a = Make(kBig, "a", 1);
  TM_ASSERT_OK(OffloadNow(rt_, a, TM_TIER_DRAM));
  void* pa = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, a, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &pa));
  tm_tensor b = Make(kBig, "b", 2);
  EXPECT_EQ(OffloadNow(rt_, b, TM_TIER_DRAM), TM_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(tm_last_error()).find("dram"), std::string::npos) << tm_last_error();
  EXPECT_EQ(Residency(b), TM_TIER_BIT(TM_TIER_HBM))
      << "a failed move must leave the tensor where it was";
  ExpectContent(b, kBig, 2);
  // HBM -> NVMe needs no DRAM copy: it streams through the staging pool, so a full DRAM tier
  // does not stop it.
  TM_ASSERT_OK(OffloadNow(rt_, b, TM_TIER_NVME));
  EXPECT_EQ(Residency(b), TM_TIER_BIT(TM_TIER_NVME));
  ExpectContent(b, kBig, 2);
  // Released, `a` makes room: written down to NVMe, then b fits.
  TM_ASSERT_OK(tm_tensor_release(rt_, a, TM_TIER_DRAM));
  TM_ASSERT_OK(OffloadNow(rt_, b, TM_TIER_DRAM));
  ExpectContent(a, kBig, 1);
  ExpectContent(b, kBig, 2);
  EXPECT_TRUE(Residency(a) & TM_TIER_BIT(TM_TIER_NVME));
}

TEST_F(Errors, NvmeBudgetExhausted) {
  const std::vector<tm_tensor> ts = FillNvme();
  tm_tensor last = Make(kBig, "one-too-many", 20);
  EXPECT_EQ(OffloadNow(rt_, last, TM_TIER_NVME), TM_ERR_NO_SPACE);
  std::string msg = tm_last_error();
  EXPECT_NE(msg.find("nvme"), std::string::npos) << msg;
  EXPECT_NE(msg.find("one-too-many"), std::string::npos) << msg;
  EXPECT_EQ(Residency(last), TM_TIER_BIT(TM_TIER_HBM));
  ExpectContent(last, kBig, 20);
  for (int i = 0; i < 4; ++i) ExpectContent(ts[i], kBig, 10 + i);
  tm_stats s = TM_STATS_INIT;
  TM_ASSERT_OK(tm_runtime_stats(rt_, &s));
  EXPECT_EQ(s.tiers[TM_TIER_DRAM].used, 0u) << "the staging copy of the failed move leaked";
}

// A move that fails on a mover is reported by the next sync or step end; when each such move
// left its tensor valid where it was, tm_last_error_flags says so (TM_ERROR_NOTHING_LOST), so
// that a framework tells a step whose work stands from one that lost bytes without reading the
// message. The flags belong to the last failure: the next one of another kind clears them.
TEST_F(Errors, AReportThatLostNothingSaysSoInItsFlags) {
  FillNvme();
  tm_tensor last = Make(kBig, "one-too-many", 20);
  TM_ASSERT_OK(tm_step_begin(rt_));
  TM_ASSERT_OK(tm_tensor_offload(rt_, last, TM_TIER_NVME));  // queued: fails on a mover
  EXPECT_EQ(tm_runtime_sync(rt_), TM_ERR_NO_SPACE);
  EXPECT_NE(std::string(tm_last_error()).find("nothing was lost"), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(tm_last_error_flags(), TM_ERROR_NOTHING_LOST) << tm_last_error();
  TM_ASSERT_OK(tm_step_end(rt_));  // reported once
  ExpectContent(last, kBig, 20);
  tm_tensor none{};
  EXPECT_EQ(tm_tensor_create(rt_, nullptr, &none), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_last_error_flags(), 0u) << "a later failure clears the flags";
  // Queued again and reported by the step end this time, once the mover has failed it.
  tm_stats before = TM_STATS_INIT;
  TM_ASSERT_OK(tm_runtime_stats(rt_, &before));
  TM_ASSERT_OK(tm_step_begin(rt_));
  TM_ASSERT_OK(tm_tensor_offload(rt_, last, TM_TIER_NVME));
  for (tm_stats now = before; now.moves_failed == before.moves_failed;) {
    TM_ASSERT_OK(tm_runtime_stats(rt_, &now));
    std::this_thread::yield();
  }
  EXPECT_EQ(tm_step_end(rt_), TM_ERR_NO_SPACE) << tm_last_error();
  EXPECT_EQ(tm_last_error_flags(), TM_ERROR_NOTHING_LOST) << tm_last_error();
  ExpectContent(last, kBig, 20);
}

TEST_F(Errors, PinnedTensorsCannotMoveOrDie) {
  tm_tensor a = Make(1 << 20, "pinned", 3);
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(OffloadNow(rt_, a, TM_TIER_NVME), TM_ERR_BUSY);
  EXPECT_NE(std::string(tm_last_error()).find("acquired in hbm"), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(tm_tensor_destroy(rt_, a), TM_ERR_BUSY);
  EXPECT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr, &p), TM_ERR_BUSY);
  auto data = RandomBytes(16, 4);
  TM_ASSERT_OK(tm_tensor_write(rt_, a, 0, data.data(), 16));  // lands in the pinned HBM copy
  TM_ASSERT_OK(tm_tensor_release(rt_, a, TM_TIER_HBM));
  EXPECT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_ERR_INVALID_ARGUMENT);
  TM_ASSERT_OK(OffloadNow(rt_, a, TM_TIER_NVME));
  std::vector<uint8_t> back(16);
  TM_ASSERT_OK(tm_tensor_read(rt_, a, 0, back.data(), 16));
  EXPECT_EQ(back, data);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, a));
}

// While a copy is acquired for writing its bytes are in flux: no other copy may be made from it
// (the stress test caught a queued prefetch copying a half-written tensor down to DRAM).
TEST_F(Errors, NoCopyIsMadeOfATensorBeingWritten) {
  tm_tensor a = Make(1 << 20, "in-flux", 5);
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p));
  std::memset(p, 0x11, 1 << 19);  // half written
  void* q = nullptr;
  EXPECT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &q), TM_ERR_BUSY);
  EXPECT_NE(std::string(tm_last_error()).find("acquired for writing in hbm"), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(tm_tensor_prefetch(rt_, a, TM_TIER_DRAM), TM_ERR_BUSY);
  EXPECT_EQ(tm_tensor_offload(rt_, a, TM_TIER_NVME), TM_ERR_BUSY);
  EXPECT_EQ(Residency(a), TM_TIER_BIT(TM_TIER_HBM));
  std::memset(static_cast<char*>(p) + (1 << 19), 0x22, 1 << 19);
  TM_ASSERT_OK(tm_tensor_release(rt_, a, TM_TIER_HBM));
  // Released: copies are made again, of the finished bytes.
  TM_ASSERT_OK(tm_tensor_acquire(rt_, a, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &q));
  EXPECT_EQ(static_cast<uint8_t*>(q)[0], 0x11);
  EXPECT_EQ(static_cast<uint8_t*>(q)[(1 << 20) - 1], 0x22);
  TM_ASSERT_OK(tm_tensor_release(rt_, a, TM_TIER_DRAM));
}

// A real full file system: a 16 MiB tmpfs cannot hold a 64 MiB NVMe tier.
TEST(FullDisk, ReservationFailsWithNoSpace) {
  TempDir mnt;
  if (mount("tiermem-test", mnt.path().c_str(), "tmpfs", 0, "size=16m") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                 << "): needs root and mount permission";
  }
  tm_config cfg = SmallConfig(mnt.path());
  cfg.nvme_bytes = 64 << 20;
  tm_runtime rt;
  tm_status st = tm_runtime_create(&cfg, &rt);
  std::string msg = tm_last_error();
  umount2(mnt.path().c_str(), MNT_DETACH);
  ASSERT_EQ(st, TM_ERR_NO_SPACE) << msg;
  EXPECT_NE(msg.find(mnt.path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space"), std::string::npos) << msg;
}

// NVMe paths on a file system that refuses O_DIRECT (ramfs): the runtime still works, through
// the page cache, and odd sizes come back bit-exact.
TEST(BufferedNvme, RuntimeRoundTripWhereODirectIsRefused) {
  TempDir mnt;
  if (mount("tiermem-test", mnt.path().c_str(), "ramfs", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount a ramfs here (" << std::strerror(errno)
                 << "): needs root and mount permission";
  }
  {
    tm_config cfg = SmallConfig(mnt.path());
    cfg.nvme_bytes = 16 << 20;
    tm_runtime rt;
    ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = (1 << 20) + 7;
    tm_tensor t;
    TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
    auto data = testing::RandomBytes(d.bytes, 3);
    TM_ASSERT_OK(tm_tensor_write(rt, t, 0, data.data(), d.bytes));
    TM_ASSERT_OK(testing::OffloadNow(rt, t, TM_TIER_NVME));
    uint32_t mask = 0;
    TM_ASSERT_OK(tm_tensor_residency(rt, t, &mask));
    EXPECT_EQ(mask, TM_TIER_BIT(TM_TIER_NVME)) << "the copy lives only on the ramfs swap file";
    std::vector<uint8_t> back(d.bytes);
    TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), d.bytes));
    EXPECT_EQ(std::memcmp(back.data(), data.data(), d.bytes), 0);
    TM_ASSERT_OK(tm_tensor_destroy(rt, t));
    TM_ASSERT_OK(tm_runtime_destroy(rt));
  }
  // Detached: a closed io_uring ring drops its registered files asynchronously, so the mount
  // can be busy for a moment after the runtime is gone.
  EXPECT_EQ(umount2(mnt.path().c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

// Budgets near 2^64 once wrapped in their round-ups: the DRAM tier mapped nothing and the first
// offload crashed; the NVMe tier reserved nothing yet reported success. Each is now a clear
// error at create: TM_ERR_CONFIG for a size no file system or address space can hold (naming
// the variable and the value), TM_ERR_NO_SPACE for one the file system refuses to reserve,
// whatever errno it chose (EFBIG, EINVAL). Set through tm_config, the budget is named as the
// struct's field (it was named as the variable, which the caller never set).
TEST(Budgets, ImpossibleBudgetsFailAtCreateNamingTheValue) {
  TempDir dir;
  struct Case {
    const char* variable;
    uint64_t dram, nvme, hbm;
    std::string paths;
    tm_status expected;
    std::string value;
  };
  TempDir other;  // on the same file system: the same directory twice is refused
  const std::string two = dir.path() + ":" + other.path();
  const Case cases[] = {
      {"tm_config.nvme_bytes=", 0, UINT64_MAX, 0, dir.path(), TM_ERR_CONFIG,
       "18446744073709551615"},
      {"tm_config.nvme_bytes=", 0, 16777215ull << 40, 0, dir.path(), TM_ERR_CONFIG,
       std::to_string(16777215ull << 40)},
      {"tm_config.nvme_bytes=", 0, 1000000ull << 40, 0, dir.path(), TM_ERR_NO_SPACE,
       std::to_string(1000000ull << 40)},
      // Each of two files just under 2^63 bytes: the kernel's EFBIG or EINVAL is NO_SPACE too.
      {"tm_config.nvme_bytes=", 0, 16777215ull << 40, 0, two, TM_ERR_NO_SPACE,
       std::to_string(16777215ull << 40)},
      {"tm_config.dram_bytes=", UINT64_MAX, 0, 0, dir.path(), TM_ERR_CONFIG,
       "18446744073709551615"},
      {"tm_config.dram_bytes=", UINT64_MAX - (1 << 20), 0, 0, dir.path(), TM_ERR_CONFIG,
       std::to_string(UINT64_MAX - (1 << 20))},
  };
  for (const Case& c : cases) {
    tm_config cfg = SmallConfig(c.paths);
    if (c.dram != 0) cfg.dram_bytes = c.dram;
    if (c.nvme != 0) cfg.nvme_bytes = c.nvme;
    tm_runtime rt{};
    tm_status st = tm_runtime_create(&cfg, &rt);
    std::string msg = tm_last_error();
    EXPECT_EQ(st, c.expected) << c.variable << c.value << ": " << tm_status_string(st) << ": "
                              << msg;
    EXPECT_NE(msg.find(c.variable), std::string::npos) << msg;
    // Set through the struct: the variable of the same meaning was never set.
    EXPECT_EQ(msg.find("TIERMEM_NVME_BYTES"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("TIERMEM_DRAM_BYTES"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.value), std::string::npos) << msg;
    EXPECT_EQ(rt.bits, 0u);
    EXPECT_EQ(dir.Entries(), 0) << "a failed create left a file behind";
  }
  // Sizes that parse but no machine has: a clear error, never TM_OK, never a crash. An HBM
  // budget beyond the device's memory is a setting no run can meet: TM_ERR_CONFIG, as a DRAM
  // budget beyond an address space is (once TM_ERR_OUT_OF_MEMORY).
  for (uint64_t bytes : {uint64_t{1} << 61, UINT64_MAX - 4095, UINT64_MAX}) {
    tm_config cfg = SmallConfig(dir.path());
    cfg.hbm_bytes = bytes;
    tm_runtime rt{};
    EXPECT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG) << "hbm " << bytes;
    EXPECT_NE(std::string(tm_last_error()).find("more than the device has"), std::string::npos)
        << tm_last_error();
    cfg = SmallConfig(dir.path());
    cfg.dram_bytes = bytes;
    EXPECT_NE(tm_runtime_create(&cfg, &rt), TM_OK) << "dram " << bytes;
  }
}

// The same values through the environment and its size suffixes.
TEST(Budgets, ImpossibleBudgetsFromTheEnvironment) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  cfg.nvme_bytes = 0;
  cfg.dram_bytes = 0;
  struct Case {
    const char* variable;
    const char* value;
    tm_status expected;
  };
  for (const Case& c : {Case{"TIERMEM_NVME_BYTES", "18446744073709551615", TM_ERR_CONFIG},
                        Case{"TIERMEM_NVME_BYTES", "16777215T", TM_ERR_CONFIG},
                        Case{"TIERMEM_NVME_BYTES", "1000000T", TM_ERR_NO_SPACE},
                        Case{"TIERMEM_NVME_BYTES", "16777216T", TM_ERR_CONFIG},
                        Case{"TIERMEM_DRAM_BYTES", "18446744073709551615", TM_ERR_CONFIG},
                        Case{"TIERMEM_DRAM_BYTES", "17592186044415M", TM_ERR_CONFIG}}) {
    testing::ScopedEnv env(c.variable, c.value);
    tm_runtime rt{};
    tm_status st = tm_runtime_create(&cfg, &rt);
    std::string msg = tm_last_error();
    EXPECT_EQ(st, c.expected) << c.variable << "=" << c.value << ": " << msg;
    EXPECT_NE(msg.find(c.variable), std::string::npos) << msg;
    if (st == TM_OK) tm_runtime_destroy(rt);
  }
}

// An HBM budget is named in messages where the caller set it: a budget from tm_config.hbm_bytes
// was reported as TIERMEM_HBM_BYTES=..., a variable the caller never set. Each way a budget can
// be refused at create (below the slab's granule, a slab no machine has, below one mapped
// chunk), from the struct and from the environment.
TEST(Budgets, HbmBudgetIsNamedWhereItWasSet) {
  TempDir dir;
  struct Case {
    const char* layout;
    uint64_t bytes;
    const char* env;
  };
  for (const Case& c : {Case{"slab", 100, "100"}, Case{"slab", uint64_t{1} << 61, "2097152T"},
                        Case{"mapped", 1 << 20, "1MiB"}}) {
    testing::ScopedEnv layout("TIERMEM_HBM_LAYOUT", c.layout);
    tm_config cfg = SmallConfig(dir.path());
    cfg.hbm_bytes = c.bytes;
    tm_runtime rt{};
    ASSERT_NE(tm_runtime_create(&cfg, &rt), TM_OK) << c.layout << " " << c.bytes;
    std::string msg = tm_last_error();
    EXPECT_NE(msg.find("tm_config.hbm_bytes="), std::string::npos) << msg;
    EXPECT_EQ(msg.find("TIERMEM_HBM_BYTES"), std::string::npos) << msg;

    testing::ScopedEnv budget("TIERMEM_HBM_BYTES", c.env);
    cfg.hbm_bytes = 0;
    ASSERT_NE(tm_runtime_create(&cfg, &rt), TM_OK) << c.layout << " " << c.env;
    msg = tm_last_error();
    EXPECT_NE(msg.find("TIERMEM_HBM_BYTES="), std::string::npos) << msg;
    EXPECT_EQ(msg.find("tm_config"), std::string::npos) << msg;
  }
}

// Every bad value set through tm_config is named as its field, never as the TIERMEM_* variable the
// caller did not set: once only the budgets were.
TEST(Budgets, EveryConfigFieldIsNamedAsAField) {
  TempDir dir;
  struct Case {
    const char* field;
    void (*set)(tm_config&);
  };
  const Case cases[] = {
      {"emu_link_gbps", [](tm_config& c) { c.emu_link_gbps = -1; }},
      {"nvme_paths", [](tm_config& c) { c.nvme_paths = "relative/dir"; }},
      {"nvme_paths", [](tm_config& c) { c.nvme_paths = "/nonexistent/tiermem-dir"; }},
      {"io_block_size", [](tm_config& c) { c.io_block_size = 3000; }},
      {"io_queue_depth", [](tm_config& c) { c.io_queue_depth = 5000; }},
      {"io_threads", [](tm_config& c) { c.io_threads = 65; }},
      {"prefetch_depth", [](tm_config& c) { c.prefetch_depth = 2000; }},
      {"trace", [](tm_config& c) { c.trace = "/tmp/bad%x"; }},
      {"trace", [](tm_config& c) { c.trace = "/nonexistent/tiermem-dir/t.json"; }},
      {"numa_node", [](tm_config& c) { c.numa_node = 4096; }},
      {"local_rank", [](tm_config& c) { c.local_rank = 3, c.local_world_size = 2; }},
  };
  for (const Case& c : cases) {
    tm_config cfg = SmallConfig(dir.path());
    c.set(cfg);
    tm_runtime rt{};
    ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG) << c.field;
    const std::string msg = tm_last_error();
    EXPECT_EQ(msg.rfind(std::string("tm_config.") + c.field, 0), 0u) << msg;
    EXPECT_EQ(msg.find("TIERMEM_"), std::string::npos) << msg;
  }
}

// TIERMEM_TRACE is opened at create, beside its final path, and renamed into place at destroy.
class TracePaths : public ::testing::Test {
 protected:
  tm_status Create(const std::string& trace) {
    trace_ = trace;
    tm_config cfg = SmallConfig(swap_.path());
    cfg.trace = trace_.c_str();
    return tm_runtime_create(&cfg, &rt_);
  }
  // A runtime that moves one tensor, so its trace holds events named `name`.
  void MoveOne(const std::string& name) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 64 << 10;
    d.name = name.c_str();
    tm_tensor t;
    TM_ASSERT_OK(tm_tensor_create(rt_, &d, &t));
    auto data = RandomBytes(d.bytes, 9);
    TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, data.data(), d.bytes));
    TM_ASSERT_OK(OffloadNow(rt_, t, TM_TIER_DRAM));
  }
  static std::string Slurp(const std::string& path) {
    std::string out;
    if (std::FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[4096];
      size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      std::fclose(f);
    }
    return out;
  }
  TempDir swap_, dir_;
  std::string trace_;
  tm_runtime rt_{};
};

TEST_F(TracePaths, UnwritablePathsFailCreateNamingThem) {
  for (const std::string& bad : {std::string("/proc/tiermem-trace.json"),
                                 dir_.path() + "/missing/trace.json", dir_.path()}) {
    ASSERT_EQ(Create(bad), TM_ERR_CONFIG) << bad;
    EXPECT_NE(std::string(tm_last_error()).find("tm_config.trace=" + bad), std::string::npos)
        << tm_last_error();
  }
  // A FIFO (which once hung destroy) and a device are refused, never opened or replaced.
  const std::string fifo = dir_.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const std::string& bad : {fifo, std::string("/dev/null")}) {
    ASSERT_EQ(Create(bad), TM_ERR_CONFIG) << bad;
    EXPECT_NE(std::string(tm_last_error()).find("not a regular file"), std::string::npos)
        << tm_last_error();
  }
  struct stat st = {};
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(dir_.Entries(), 1) << "a refused trace left a file behind";
}

// A symlink at the path (once followed: its target truncated, or created 0644 when dangling)
// is replaced by the trace; its target is never touched.
TEST_F(TracePaths, SymlinksAreReplacedNeverFollowed) {
  const std::string target = dir_.path() + "/precious";
  {
    std::FILE* f = std::fopen(target.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("keep me", f);
    std::fclose(f);
  }
  const std::string link = dir_.path() + "/trace.json";
  const std::string dangling = dir_.path() + "/dangling.json";
  const std::string nowhere = dir_.path() + "/nowhere";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_EQ(symlink(nowhere.c_str(), dangling.c_str()), 0);
  for (const std::string& path : {link, dangling}) {
    ASSERT_EQ(Create(path), TM_OK) << tm_last_error();
    MoveOne("t");
    ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
    struct stat st = {};
    ASSERT_EQ(lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << path << " is still a link";
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_TRUE(testing::Json(Slurp(path)).Valid());
  }
  EXPECT_EQ(Slurp(target), "keep me");
  EXPECT_NE(access(nowhere.c_str(), F_OK), 0) << "the dangling link's target was created";
  EXPECT_EQ(dir_.Entries(), 3) << "precious, trace.json, dangling.json and nothing else";
}

// %p and %r give each process and rank its own file; %% is a percent sign.
TEST_F(TracePaths, PidAndRankExpand) {
  testing::ScopedEnv env("TIERMEM_LOCAL_RANK", "3");
  ASSERT_EQ(Create(dir_.path() + "/t-%p-r%r-%%.json"), TM_OK) << tm_last_error();
  MoveOne("t");
  ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
  const std::string expected = dir_.path() + "/t-" + std::to_string(getpid()) + "-r3-%.json";
  EXPECT_TRUE(testing::Json(Slurp(expected)).Valid()) << expected;
  EXPECT_EQ(dir_.Entries(), 1);
  env.Set("TIERMEM_LOCAL_RANK", std::nullopt);
  env.Set("LOCAL_RANK", "5");
  ASSERT_EQ(Create(dir_.path() + "/u-%r.json"), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
  EXPECT_TRUE(testing::Json(Slurp(dir_.path() + "/u-5.json")).Valid());
}

// Names with control characters, quotes, bytes that are not UTF-8, and a 256-byte cut that
// falls inside a character (once invalid JSON): the trace is valid JSON all the same, and the
// cut lands before the character.
TEST_F(TracePaths, AnyTensorNameGivesValidJson) {
  ASSERT_EQ(Create(dir_.path() + "/trace.json"), TM_OK) << tm_last_error();
  const std::string cut_inside = std::string(255, 'a') + "\xc3\xa9" + "tail";  // e-acute at 255
  MoveOne(cut_inside);
  MoveOne(std::string("ctl\x01\x1f\x7f \"q\" \\ bad\xff\xfe\xc3 over\xe0\x80\x80 sur\xed\xa0\x80"));
  MoveOne("\xf0\x9f\x98\x80 ok \xe2\x82\xac");
  ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
  const std::string text = Slurp(dir_.path() + "/trace.json");
  EXPECT_TRUE(testing::Json(text).Valid()) << text.substr(0, 2000);
  EXPECT_NE(text.find("\"name\":\"" + std::string(255, 'a') + "\""), std::string::npos)
      << "the cut should fall before the 2-byte character";
  EXPECT_NE(text.find("\\u0001"), std::string::npos);
  EXPECT_NE(text.find("\\u007f"), std::string::npos);
  EXPECT_NE(text.find("\\ufffd"), std::string::npos);
  EXPECT_NE(text.find("\xf0\x9f\x98\x80 ok \xe2\x82\xac"), std::string::npos)
      << "valid UTF-8 is kept";
}

TEST(BadPaths, MissingDirectoryIsAConfigError) {
  const std::string missing = "/nonexistent/tiermem";
  tm_config cfg = SmallConfig(missing);
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG);
  EXPECT_NE(std::string(tm_last_error()).find("/nonexistent/tiermem"), std::string::npos)
      << tm_last_error();
}

TEST(BadPaths, ForcedCudaWithoutDeviceIsADeviceError) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  cfg.device = TM_DEVICE_CUDA;
  tm_runtime rt;
  tm_status st = tm_runtime_create(&cfg, &rt);
  if (st == TM_OK) {
    tm_runtime_destroy(rt);
    GTEST_SKIP() << "this machine has a CUDA device";
  }
  EXPECT_EQ(st, TM_ERR_DEVICE) << tm_last_error();
  EXPECT_NE(std::string(tm_last_error()).find("TIERMEM_DEVICE=cuda"), std::string::npos)
      << tm_last_error();
}

}  // namespace
}  // namespace tiermem
