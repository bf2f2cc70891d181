// Inclusive DRAM (TIERMEM_DRAM_INCLUSIVE) as an outside client meets it, through the C API only,
// on and off: a write-through that finds NVMe full leaves a dirty DRAM copy that pressure must
// write, never drop; writes, read-write acquires and copy_ins racing a running write-through
// end up on NVMe; a copy_out from a clean copy survives a demand that drops that copy at once.
// Each check reads the bytes back after pushing every upper copy out, so NVMe itself is read.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace {

using tiermem::testing::kSanitized;
using tiermem::testing::RandomBytes;
using tiermem::testing::ScopedEnv;
using tiermem::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

class InclusiveClient : public ::testing::TestWithParam<bool> {
 protected:
  // A runtime on the emulated device; `link_gbps` slows the HBM <-> DRAM copies so that a
  // racing call lands while the write-through runs.
  void Start(uint64_t dram, uint64_t nvme, double link_gbps = 0) {
    env_.Set("TIERMEM_DRAM_INCLUSIVE", GetParam() ? "on" : "off");
    tm_config c = TM_CONFIG_INIT;
    c.device = TM_DEVICE_EMULATED;
    c.hbm_bytes = 64 * kMiB;
    c.dram_bytes = dram;
    c.nvme_bytes = nvme;
    c.nvme_paths = dir_.path().c_str();
    c.prefetch_depth = 0;
    c.log_level = TM_LOG_ERROR;
    c.emu_link_gbps = link_gbps;
    ASSERT_EQ(tm_runtime_create(&c, &rt_), TM_OK) << tm_last_error();
    tm_stats s = TM_STATS_INIT;
    ASSERT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    dram_room_ = s.tiers[TM_TIER_DRAM].capacity;
  }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error();
    }
  }
  tm_tensor Make(const std::string& name, uint64_t bytes, tm_tier home) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.home_tier = home;
    d.name = name.c_str();
    tm_tensor t = {0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  uint32_t Residency(tm_tensor t) {
    uint32_t m = 0;
    EXPECT_EQ(tm_tensor_residency(rt_, t, &m), TM_OK);
    return m;
  }
  // Bytes as read back: whole tensor, compared with `want`.
  void ExpectBytes(tm_tensor t, const std::vector<uint8_t>& want, const std::string& what) {
    std::vector<uint8_t> got(want.size(), 0xAB);
    ASSERT_EQ(tm_tensor_read(rt_, t, 0, got.data(), got.size()), TM_OK)
        << what << ": " << tm_last_error();
    EXPECT_TRUE(got == want) << what << ": wrong bytes (residency " << Residency(t) << ")";
  }
  // A DRAM-homed tensor of the whole DRAM room, written: every other DRAM copy must leave.
  tm_tensor FillDram(int seed) {
    tm_tensor f = Make("filler", dram_room_, TM_TIER_DRAM);
    auto bytes = RandomBytes(dram_room_, seed);
    EXPECT_EQ(tm_tensor_write(rt_, f, 0, bytes.data(), bytes.size()), TM_OK) << tm_last_error();
    return f;
  }

  ScopedEnv env_;
  TempDir dir_;
  tm_runtime rt_ = {0};
  uint64_t dram_room_ = 0;
};

TEST_P(InclusiveClient, FailedWriteThroughLeavesADirtyCopyPressureNeverDrops) {
  Start(12 * kMiB, 4 * kMiB);  // NVMe holds three of the tensors below, not four
  const uint64_t n = kMiB + 13;
  std::vector<tm_tensor> t;
  std::vector<std::vector<uint8_t>> want;
  int failed = 0;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "victim" + std::to_string(i);
    t.push_back(Make(name, n, TM_TIER_HBM));
    want.push_back(RandomBytes(n, 100 + i));
    ASSERT_EQ(tm_tensor_write(rt_, t[i], 0, want[i].data(), n), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_offload(rt_, t[i], TM_TIER_NVME), TM_OK) << tm_last_error();
    const tm_status s = tm_tensor_sync(rt_, t[i]);
    if (s == TM_OK) continue;
    ++failed;
    EXPECT_EQ(s, TM_ERR_NO_SPACE) << tm_last_error();
    EXPECT_NE(std::string(tm_last_error()).find("\"" + name + "\""), std::string::npos)
        << tm_last_error();
    const uint32_t m = Residency(t[i]);
    EXPECT_NE(m, 0u) << name << " lost every copy";
    EXPECT_EQ(m & TM_TIER_BIT(TM_TIER_NVME), 0u) << name << " claims an NVMe copy";
  }
  EXPECT_GE(failed, 2);
  // Pressure on DRAM: the copies the failed write-throughs left are the only ones; dropping
  // them as clean would lose the tensors. Eviction may fail (NVMe is full), never drop them.
  std::vector<uint8_t> filler = RandomBytes(kMiB, 7);
  for (int j = 0; j < 16; ++j) {
    tm_tensor f = Make("filler" + std::to_string(j), kMiB, TM_TIER_DRAM);
    if (tm_tensor_write(rt_, f, 0, filler.data(), kMiB) != TM_OK) break;
  }
  (void)tm_runtime_sync(rt_);
  for (size_t i = 0; i < t.size(); ++i) ExpectBytes(t[i], want[i], "victim" + std::to_string(i));
  tm_stats s = TM_STATS_INIT;
  ASSERT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
  EXPECT_LE(s.clean_drop_bytes, (t.size() - failed) * n) << "a dirty copy was counted clean";
}

TEST_P(InclusiveClient, CallsRacingAWriteThroughEndUpOnNvme) {
  Start(24 * kMiB, 256 * kMiB, 2.0);
  const uint64_t n = 8 * kMiB + 3;
  tm_tensor t = Make("raced", n, TM_TIER_HBM);
  std::vector<uint8_t> want = RandomBytes(n, 1);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, want.data(), n), TM_OK);
  // Each of the four ways of racing runs four times; twice under a sanitizer (21 s a case under
  // TSan at four).
  const int rounds = kSanitized ? 8 : 16;
  for (int round = 0; round < rounds; ++round) {
    const int mode = round % 4;
    const uint64_t off = (round * 1234567ull) % n;
    const uint64_t len = 1 + (round * 7654321ull) % (n - off);
    std::vector<uint8_t> patch = RandomBytes(len, 1000 + round);
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
    ASSERT_EQ(tm_tensor_release(rt_, t, TM_TIER_HBM), TM_OK);
    tm_status racer = TM_OK;
    std::thread th([&] {
      // not ordering: staggers the racer against the offload, round by round, so that the races
      // land at different points of the write-through; every interleaving must end on NVMe
      std::this_thread::sleep_for(std::chrono::microseconds(300 * (round % 5)));
      void* q = nullptr;
      const tm_tier tier = mode == 1 ? TM_TIER_DRAM : TM_TIER_HBM;
      switch (mode) {
        case 0:
          racer = tm_tensor_write(rt_, t, off, patch.data(), len);
          break;
        case 2:
          racer = tm_tensor_copy_in(rt_, t, off, patch.data(), len, nullptr);
          if (racer == TM_OK) racer = tm_tensor_sync(rt_, t);
          break;
        default:
          racer = tm_tensor_acquire(rt_, t, tier, TM_ACCESS_READ_WRITE, nullptr, &q);
          if (racer == TM_OK) {
            std::memcpy(static_cast<uint8_t*>(q) + off, patch.data(), len);
            racer = tm_tensor_release(rt_, t, tier);
          }
      }
    });
    const tm_status offload = tm_tensor_offload(rt_, t, TM_TIER_NVME);
    const std::string offload_error = offload == TM_OK ? "" : tm_last_error();
    th.join();
    // A racer that already holds its acquire when the offload is asked for has it refused at
    // once (TM_ERR_BUSY, documented), naming the tensor; the offload below then moves it.
    ASSERT_TRUE(offload == TM_OK ||
                (offload == TM_ERR_BUSY && offload_error.find("\"raced\"") != std::string::npos))
        << "mode " << mode << ": " << offload_error;
    ASSERT_EQ(racer, TM_OK) << "mode " << mode;
    std::memcpy(want.data() + off, patch.data(), len);
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    // Push every upper copy out and read what NVMe holds.
    tm_tensor f = FillDram(round);
    ASSERT_EQ(tm_tensor_offload(rt_, t, TM_TIER_NVME), TM_OK) << tm_last_error();
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    ASSERT_EQ(Residency(t), TM_TIER_BIT(TM_TIER_NVME)) << "round " << round;
    ExpectBytes(t, want, "round " + std::to_string(round) + " mode " + std::to_string(mode));
    ASSERT_EQ(tm_tensor_destroy(rt_, f), TM_OK);
  }
}

TEST_P(InclusiveClient, CopyOutOfACleanCopySurvivesADemandThatDropsIt) {
  Start(10 * kMiB, 256 * kMiB, 1.0);
  const uint64_t n = 6 * kMiB + 5;
  tm_tensor t = Make("copied", n, TM_TIER_HBM);
  const std::vector<uint8_t> want = RandomBytes(n, 3);
  ASSERT_EQ(tm_tensor_write(rt_, t, 0, want.data(), n), TM_OK);
  uint64_t clean_copies = 0;
  for (int round = 0; round < 6; ++round) {
    ASSERT_EQ(tm_tensor_offload(rt_, t, TM_TIER_NVME), TM_OK);
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    const uint32_t m = Residency(t);
    clean_copies += (m & TM_TIER_BIT(TM_TIER_DRAM)) != 0;
    EXPECT_EQ(m, GetParam() ? TM_TIER_BIT(TM_TIER_DRAM) | TM_TIER_BIT(TM_TIER_NVME)
                            : TM_TIER_BIT(TM_TIER_NVME));
    std::vector<uint8_t> got(n, 0);
    ASSERT_EQ(tm_tensor_copy_out(rt_, t, 0, got.data(), n, nullptr), TM_OK) << tm_last_error();
    tm_tensor f = FillDram(round);  // drops the clean copy first
    ASSERT_EQ(tm_tensor_sync(rt_, t), TM_OK) << tm_last_error();
    EXPECT_TRUE(got == want) << "round " << round << ": copy_out delivered wrong bytes";
    ExpectBytes(t, want, "round " + std::to_string(round));
    ASSERT_EQ(tm_tensor_destroy(rt_, f), TM_OK);
    void* p = nullptr;  // back to HBM only, so that the next offload writes through again
    ASSERT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr, &p), TM_OK);
    ASSERT_EQ(tm_tensor_release(rt_, t, TM_TIER_HBM), TM_OK);
  }
  EXPECT_EQ(clean_copies, GetParam() ? 6u : 0u);
}

INSTANTIATE_TEST_SUITE_P(DramInclusive, InclusiveClient, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "On" : "Off";
                         });

}  // namespace
