// tm_stats.bytes_moved against the bytes a known workload must move, path by path, on both I/O
// engines: every byte that crosses a tier boundary is counted once per hop, and nothing else.
// Tensors are odd-sized (a whole number of neither pages nor staging chunks), so a count that
// rounds, skips the last chunk or counts a chunk twice is off.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

// The default tiers (inclusive DRAM) but where a test counts the bytes that cross NVMe itself,
// for which inclusive DRAM's clean copies would stand in (tests/inclusive_test.cc).

namespace tiermem {
namespace {

using testing::RandomBytes;
using Moved = std::array<std::array<uint64_t, TM_TIER_COUNT>, TM_TIER_COUNT>;

constexpr int H = TM_TIER_HBM;
constexpr int D = TM_TIER_DRAM;
constexpr int N = TM_TIER_NVME;

class BytesMoved : public ::testing::TestWithParam<tm_io_engine> {
 protected:
  void Start(uint64_t dram_bytes) {
    tm_config c = testing::SmallConfig(dir_.path(), GetParam());
    c.hbm_bytes = 64ull << 20;
    c.dram_bytes = dram_bytes;
    c.nvme_bytes = 512ull << 20;
    c.prefetch_depth = 0;  // nothing moves unless the test moves it
    TM_ASSERT_OK(tm_runtime_create(&c, &rt_));
    last_ = Now();
  }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK);
    }
  }
  tm_tensor Make(uint64_t bytes, tm_tier home, const char* name) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.home_tier = home;
    d.name = name;
    tm_tensor t{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  Moved Now() {
    EXPECT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    Moved m{};
    for (int f = 0; f < TM_TIER_COUNT; ++f)
      for (int t = 0; t < TM_TIER_COUNT; ++t) m[f][t] = s.bytes_moved[f][t];
    return m;
  }
  // What moved since the last call, against `want` (every other cell must be 0).
  void ExpectMoved(const char* what, std::vector<std::pair<std::pair<int, int>, uint64_t>> want) {
    const Moved now = Now();
    Moved expected{};
    for (auto& [hop, bytes] : want) expected[hop.first][hop.second] += bytes;
    for (int f = 0; f < TM_TIER_COUNT; ++f) {
      for (int t = 0; t < TM_TIER_COUNT; ++t) {
        EXPECT_EQ(now[f][t] - last_[f][t], expected[f][t])
            << what << ": bytes_moved[" << tm_tier_name(static_cast<tm_tier>(f)) << "]["
            << tm_tier_name(static_cast<tm_tier>(t)) << "]";
      }
    }
    last_ = now;
  }

  testing::TempDir dir_;
  tm_runtime rt_{0};
  Moved last_{};
};

TEST_P(BytesMoved, RuntimeMovesCountEachHopOnce) {
  testing::ScopedEnv exclusive("TIERMEM_DRAM_INCLUSIVE", "off");  // counts NVMe's own hops
  Start(128ull << 20);
  const uint64_t S = (5ull << 20) + 4093;
  const std::vector<uint8_t> data = RandomBytes(S, 1);
  tm_tensor t = Make(S, TM_TIER_DRAM, "moves");
  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 0, data.data(), S, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("copy_in from host memory into the DRAM copy (a caller is not a tier)", {});

  TM_ASSERT_OK(tm_tensor_offload(rt_, t, TM_TIER_NVME));
  ExpectMoved("offload DRAM -> NVMe", {{{D, N}, S}});
  TM_ASSERT_OK(tm_tensor_prefetch(rt_, t, TM_TIER_DRAM));
  ExpectMoved("prefetch NVMe -> DRAM", {{{N, D}, S}});

  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
  ExpectMoved("acquire DRAM -> HBM", {{{D, H}, S}});

  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
  ExpectMoved("acquire for writing, already in HBM", {});
  TM_ASSERT_OK(tm_tensor_offload(rt_, t, TM_TIER_NVME));
  ExpectMoved("offload HBM -> NVMe (staged: both hops)", {{{H, D}, S}, {{D, N}, S}});
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
  ExpectMoved("acquire NVMe -> HBM (staged: both hops)", {{{N, D}, S}, {{D, H}, S}});
  TM_ASSERT_OK(tm_tensor_offload(rt_, t, TM_TIER_DRAM));
  ExpectMoved("offload HBM -> DRAM", {{{H, D}, S}});

  std::vector<uint8_t> back(S);
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 0, back.data(), S, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("copy_out of the DRAM copy", {});
  EXPECT_EQ(back, data);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

TEST_P(BytesMoved, CallerCopiesStraightToAndFromNvmeCountTheirStaging) {
  Start(128ull << 20);
  const uint64_t S = (9ull << 20) + 4093;
  const std::vector<uint8_t> data = RandomBytes(S, 2);
  tm_tensor t = Make(S, TM_TIER_NVME, "caller");

  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 0, data.data(), S, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("copy_in straight to NVMe", {{{D, N}, S}});
  std::vector<uint8_t> back(S);
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 0, back.data(), S, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("copy_out straight from NVMe", {{{N, D}, S}});
  EXPECT_EQ(back, data);

  // 100 bytes inside one chunk: every chunk is rewritten whole into a fresh extent, and no chunk
  // is covered whole by the caller, so all of the old copy is read once.
  const std::vector<uint8_t> patch = RandomBytes(100, 3);
  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 4097, patch.data(), patch.size(), nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("partial copy_in on NVMe (read-modify-write)", {{{N, D}, S}, {{D, N}, S}});

  TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, data.data(), S));
  ExpectMoved("tm_tensor_write straight to NVMe", {{{D, N}, S}});
  TM_ASSERT_OK(tm_tensor_write(rt_, t, 4097, patch.data(), patch.size()));
  ExpectMoved("partial tm_tensor_write on NVMe", {{{N, D}, S}, {{D, N}, S}});
  std::fill(back.begin(), back.end(), 0);
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), S));
  ExpectMoved("tm_tensor_read straight from NVMe", {{{N, D}, S}});
  std::vector<uint8_t> want = data;
  std::memcpy(want.data() + 4097, patch.data(), patch.size());
  EXPECT_EQ(back, want);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

// As a new user first met it: a tensor larger than the whole DRAM tier, in and out of NVMe
// through the staging slots of a 12 MiB DRAM tier.
TEST_P(BytesMoved, TensorLargerThanDramThroughStaging) {
  Start(12ull << 20);
  const uint64_t S = (32ull << 20) + 4093;
  const std::vector<uint8_t> data = RandomBytes(S, 4);
  tm_tensor t = Make(S, TM_TIER_NVME, "large");
  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 0, data.data(), S, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("copy_in of 32 MiB + 4093 B through a 12 MiB DRAM tier", {{{D, N}, S}});
  std::vector<uint8_t> back(S);
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 0, back.data(), S, nullptr));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  ExpectMoved("its copy_out", {{{N, D}, S}});
  EXPECT_EQ(back, data);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

// Callers' copies are counted on their one path, each successful call once, whatever tier the
// tensor is in; a refused call counts nothing.
TEST_P(BytesMoved, CallersCopiesCountEveryCall) {
  Start(64ull << 20);
  auto copied = [&](uint64_t* in, uint64_t* out) {
    tm_stats s = TM_STATS_INIT;
    ASSERT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    *in = s.copied_in_bytes;
    *out = s.copied_out_bytes;
  };
  const uint64_t n = 3 * 4096 + 17;
  std::vector<uint8_t> a = RandomBytes(n, 5), back(n);
  tm_tensor t = Make(n, TM_TIER_DRAM, "c");
  TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, a.data(), n));
  TM_ASSERT_OK(tm_tensor_copy_in(rt_, t, 7, a.data(), n - 7, nullptr));
  TM_ASSERT_OK(tm_tensor_offload(rt_, t, TM_TIER_NVME));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), n));
  TM_ASSERT_OK(tm_tensor_copy_out(rt_, t, 1, back.data(), 100, nullptr));
  EXPECT_EQ(tm_tensor_read(rt_, t, n, back.data(), 1), TM_ERR_INVALID_ARGUMENT);
  uint64_t in = 0, out = 0;
  copied(&in, &out);
  EXPECT_EQ(in, n + (n - 7));
  EXPECT_EQ(out, n + 100);
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = n;
  d.home_tier = TM_TIER_DRAM;
  d.name = "made";
  tm_tensor made{0};
  int32_t done = 0;
  TM_ASSERT_OK(tm_tensor_create_copy_in_async(rt_, &d, a.data(), nullptr, &made, &done));
  copied(&in, &out);
  EXPECT_EQ(in, n + (n - 7) + n);
}

INSTANTIATE_TEST_SUITE_P(Engines, BytesMoved,
                         ::testing::Values(TM_IO_ENGINE_URING, TM_IO_ENGINE_POSIX),
                         [](const ::testing::TestParamInfo<tm_io_engine>& i) {
                           return std::string(i.param == TM_IO_ENGINE_URING ? "uring" : "posix");
                         });

}  // namespace
}  // namespace tiermem
