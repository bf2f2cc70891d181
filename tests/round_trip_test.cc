// Round trips of random bytes HBM -> DRAM -> NVMe -> DRAM -> HBM through the C API, on both I/O
// engines, bit-exact, with residency and tier usage checked at every step (memory must be
// released, not only data returned).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::OffloadNow;
using testing::RandomBytes;
using testing::SmallConfig;
using testing::TempDir;

uint64_t Used(tm_runtime rt, tm_tier tier) {
  tm_stats s = TM_STATS_INIT;
  EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK);
  return s.tiers[tier].used;
}

uint32_t Residency(tm_runtime rt, tm_tensor t) {
  uint32_t m = 0;
  EXPECT_EQ(tm_tensor_residency(rt, t, &m), TM_OK);
  return m;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<tm_io_engine, uint64_t>> {};

TEST_P(RoundTrip, BitExactThroughEveryTier) {
  // Exclusive tiers: the bytes must come back from NVMe itself (inclusive DRAM would serve its
  // clean copy; tests/inclusive_test.cc covers that).
  testing::ScopedEnv exclusive("TIERMEM_DRAM_INCLUSIVE", "off");
  auto [engine, bytes] = GetParam();
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path(), engine);
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  char name[32];
  TM_ASSERT_OK(tm_runtime_config_value(rt, "TIERMEM_IO_ENGINE", name, sizeof name, nullptr));
  EXPECT_STREQ(name, engine == TM_IO_ENGINE_URING ? "uring" : "posix");

  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = bytes;
  d.cls = TM_CLASS_ACTIVATION;
  d.home_tier = TM_TIER_HBM;
  d.name = "round-trip";
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  EXPECT_EQ(Residency(rt, t), 0u);

  const auto data = RandomBytes(bytes, bytes * 31 + engine);
  TM_ASSERT_OK(tm_tensor_write(rt, t, 0, data.data(), bytes));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_HBM));
  EXPECT_GE(Used(rt, TM_TIER_HBM), bytes);

  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_DRAM));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_DRAM));
  EXPECT_EQ(Used(rt, TM_TIER_HBM), 0u) << "offload must free the HBM copy";

  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_NVME));
  EXPECT_EQ(Used(rt, TM_TIER_DRAM), 0u) << "offload must free the DRAM copy";
  EXPECT_GE(Used(rt, TM_TIER_NVME), bytes);

  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_DRAM) | TM_TIER_BIT(TM_TIER_NVME));
  EXPECT_EQ(std::memcmp(p, data.data(), bytes), 0) << "NVMe -> DRAM changed the bytes";
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_DRAM));

  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_TRUE(Residency(rt, t) & TM_TIER_BIT(TM_TIER_HBM));
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_HBM));
  std::vector<uint8_t> back(bytes);
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), bytes));
  EXPECT_EQ(back, data) << "DRAM -> HBM changed the bytes";

  // Straight from NVMe to HBM: staged through DRAM, and the staging copy is freed.
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  EXPECT_EQ(Used(rt, TM_TIER_HBM), 0u);
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_HBM));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_HBM) | TM_TIER_BIT(TM_TIER_NVME));
  EXPECT_EQ(Used(rt, TM_TIER_DRAM), 0u) << "the DRAM staging copy was kept";
  std::fill(back.begin(), back.end(), 0);
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), bytes));
  EXPECT_EQ(back, data);

  tm_stats s = TM_STATS_INIT;
  TM_ASSERT_OK(tm_runtime_stats(rt, &s));
  EXPECT_EQ(s.bytes_moved[TM_TIER_HBM][TM_TIER_DRAM], bytes);
  EXPECT_EQ(s.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME], bytes);
  EXPECT_EQ(s.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM], 2 * bytes);
  EXPECT_EQ(s.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM], 2 * bytes);
  EXPECT_EQ(s.tensors, 1u);

  TM_ASSERT_OK(tm_tensor_destroy(rt, t));
  EXPECT_EQ(Used(rt, TM_TIER_HBM) + Used(rt, TM_TIER_DRAM) + Used(rt, TM_TIER_NVME), 0u);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

INSTANTIATE_TEST_SUITE_P(
    EnginesAndSizes, RoundTrip,
    ::testing::Combine(::testing::Values(TM_IO_ENGINE_URING, TM_IO_ENGINE_POSIX),
                       ::testing::Values(1ull, 4095ull, 4096ull, (1ull << 20) + 7, 64ull << 20)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == TM_IO_ENGINE_URING ? "uring" : "posix") + "_" +
             std::to_string(std::get<1>(info.param));
    });

// Partial writes and reads at odd offsets land in whichever tier holds the tensor.
TEST(RoundTrip, PartialWritesInEveryTier) {
  // Exclusive tiers: the bytes must come back from NVMe itself (inclusive DRAM would serve its
  // clean copy; tests/inclusive_test.cc covers that).
  testing::ScopedEnv exclusive("TIERMEM_DRAM_INCLUSIVE", "off");
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  const uint64_t n = 3 * 4096 + 123;
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = n;
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  std::vector<uint8_t> model(n, 0);
  std::vector<uint8_t> back(n, 0xff);
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), n));
  EXPECT_EQ(back, model) << "a tensor never written reads as zeros";

  uint64_t seed = 1;
  for (tm_tier where : {TM_TIER_HBM, TM_TIER_DRAM, TM_TIER_NVME, TM_TIER_HBM}) {
    if (where != TM_TIER_HBM) {
      TM_ASSERT_OK(OffloadNow(rt, t, where));
    }
    for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{8190}, n - 5}) {
      auto patch = RandomBytes(std::min<uint64_t>(777, n - off), ++seed);
      TM_ASSERT_OK(tm_tensor_write(rt, t, off, patch.data(), patch.size()));
      std::memcpy(model.data() + off, patch.data(), patch.size());
    }
    if (where == TM_TIER_NVME) {
      EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_NVME)) << "a write kept NVMe residency";
      EXPECT_EQ(Used(rt, TM_TIER_DRAM), 0u);
    }
    TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), n));
    ASSERT_EQ(back, model) << "after writes in " << tm_tier_name(where);
    std::vector<uint8_t> piece(100);
    TM_ASSERT_OK(tm_tensor_read(rt, t, 4000, piece.data(), piece.size()));
    EXPECT_EQ(0, std::memcmp(piece.data(), model.data() + 4000, piece.size()));
  }
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

// A write acquire makes the other copies stale; a read acquire keeps them.
TEST(RoundTrip, AcquireModes) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 1 << 20;
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr, &p));
  std::memset(p, 0x5a, 1 << 20);
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_DRAM));
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(static_cast<uint8_t*>(p)[12345], 0x5a);
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_DRAM));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_DRAM) | TM_TIER_BIT(TM_TIER_NVME));
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr, &p));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_DRAM)) << "the NVMe copy went stale";
  static_cast<uint8_t*>(p)[0] = 1;
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_DRAM));
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  uint8_t b[2] = {};
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, b, 2));
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 0x5a);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

// A read acquire released as written (tm_tensor_release_written): the copy becomes the only one
// in that one call, and what was written through the pointer is what goes down; refused, with
// the pin and every copy left as they were, where it cannot be.
TEST(RoundTrip, ReleaseWrittenMakesTheCopyTheOnlyOne) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 1 << 16;
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  const auto data = RandomBytes(d.bytes, 7);
  TM_ASSERT_OK(tm_tensor_write(rt, t, 0, data.data(), d.bytes));
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  EXPECT_EQ(tm_tensor_release_written(rt, t, TM_TIER_DRAM, nullptr), TM_ERR_INVALID_ARGUMENT)
      << "not acquired";
  void* p = nullptr;
  void* q = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &q));
  const uint32_t all =
      TM_TIER_BIT(TM_TIER_HBM) | TM_TIER_BIT(TM_TIER_DRAM) | TM_TIER_BIT(TM_TIER_NVME);
  EXPECT_EQ(Residency(rt, t), all);
  static_cast<uint8_t*>(q)[0] = static_cast<uint8_t>(data[0] + 1);
  // DRAM's copy is pinned too, so HBM's cannot become the only one: nothing changes.
  EXPECT_EQ(tm_tensor_release_written(rt, t, TM_TIER_HBM, nullptr), TM_ERR_BUSY);
  EXPECT_NE(std::string(tm_last_error()).find("release it as written"), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(Residency(rt, t), all);
  TM_ASSERT_OK(tm_tensor_release(rt, t, TM_TIER_DRAM));
  TM_ASSERT_OK(tm_tensor_release_written(rt, t, TM_TIER_HBM, nullptr));
  EXPECT_EQ(Residency(rt, t), TM_TIER_BIT(TM_TIER_HBM)) << "the other copies went stale";
  EXPECT_EQ(tm_tensor_release(rt, t, TM_TIER_HBM), TM_ERR_INVALID_ARGUMENT)
      << "one call dropped the one pin";
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));  // written down: the new bytes
  std::vector<uint8_t> back(d.bytes);
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), d.bytes));
  EXPECT_EQ(back[0], static_cast<uint8_t>(data[0] + 1));
  EXPECT_EQ(std::memcmp(back.data() + 1, data.data() + 1, d.bytes - 1), 0);
  // Acquired for writing as well: the only copy already, the pin dropped all the same.
  TM_ASSERT_OK(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release_written(rt, t, TM_TIER_DRAM, nullptr));
  EXPECT_EQ(tm_tensor_release(rt, t, TM_TIER_DRAM), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_tensor_release_written(rt, t, static_cast<tm_tier>(7), nullptr),
            TM_ERR_INVALID_ARGUMENT);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

// Several NVMe paths: extents are striped over all of them and still come back whole.
TEST(RoundTrip, StripedOverTwoPaths) {
  TempDir a, b;
  std::string paths = a.path() + ":" + b.path();
  tm_config cfg = SmallConfig(paths);
  cfg.io_block_size = 64 << 10;
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = (5 << 20) + 3;
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  auto data = RandomBytes(d.bytes, 99);
  TM_ASSERT_OK(tm_tensor_write(rt, t, 0, data.data(), d.bytes));
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  std::vector<uint8_t> back(d.bytes);
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), d.bytes));
  EXPECT_EQ(back, data);
  EXPECT_EQ(a.Entries(), 0) << "swap files must have no name";
  EXPECT_EQ(b.Entries(), 0);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

}  // namespace
}  // namespace tiermem
