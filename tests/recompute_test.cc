// Recompute callbacks (tm_tensor_set_recompute, lib/runtime/recompute.cc), through the C API on
// the emulated device: a tensor whose rebuild costs less than the round trip is dropped instead
// of written down and rebuilt bit-exact by its next use; a costlier one is written down; a
// failing callback gives a clear error and serves nothing; clearing rebuilds first; a dropped
// tensor can be destroyed; the counters count; bad arguments are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::RandomBytes;
using testing::ScopedEnv;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBytes = kMiB;

// What a callback rebuilds (the bytes of `seed`) and what it saw.
struct Rebuild {
  uint64_t seed = 0;
  tm_status result = TM_OK;  // anything else: writes garbage, then fails
  int calls = 0;
  tm_tier tier = TM_TIER_COUNT;
  uint64_t bytes = 0;
  uint64_t handle = 0;
};

tm_status RebuildBytes(void* user, tm_tensor tensor, tm_tier tier, void* dst, uint64_t bytes,
                       void* /*stream*/) {
  auto* r = static_cast<Rebuild*>(user);
  ++r->calls;
  r->tier = tier;
  r->bytes = bytes;
  r->handle = tensor.bits;
  if (r->result != TM_OK) {
    std::memset(dst, 0xAB, bytes / 2);  // half-done work that must never be served
    return r->result;
  }
  const std::vector<uint8_t> v = RandomBytes(bytes, r->seed);
  std::memcpy(dst, v.data(), bytes);  // the emulated device's HBM is host memory
  return TM_OK;
}

class RecomputeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 1 GB/s: 1 MiB down and back up takes 2.1 ms; a rebuild of 1 us is cheaper, 10 s is not.
    env_.Set("TIERMEM_LINK_GBPS", "1");
    env_.Set("TIERMEM_NVME_GBPS", "1");
    env_.Set("TIERMEM_DRAM_INCLUSIVE", "off");
    tm_config c = testing::SmallConfig(dir_.path());
    c.device = TM_DEVICE_EMULATED;
    c.hbm_bytes = 3 * kBytes;
    c.dram_bytes = 3 * kBytes;
    c.prefetch_depth = 0;
    c.log_level = TM_LOG_ERROR;
    ASSERT_EQ(tm_runtime_create(&c, &rt_), TM_OK) << tm_last_error();
  }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error();
    }
  }

  tm_tensor Make(const char* name, uint64_t seed, tm_tier home = TM_TIER_HBM) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = kBytes;
    d.home_tier = home;
    d.name = name;
    tm_tensor t{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    const std::vector<uint8_t> v = RandomBytes(kBytes, seed);
    EXPECT_EQ(tm_tensor_write(rt_, t, 0, v.data(), kBytes), TM_OK) << tm_last_error();
    return t;
  }
  // Fills the home tier of `home` with three more tensors: the oldest copy there is evicted.
  void Pressure(tm_tier home = TM_TIER_HBM) {
    for (int i = 0; i < 3; ++i) others_.push_back(Make("filler", 1000 + others_.size(), home));
  }
  uint32_t Residency(tm_tensor t) {
    uint32_t m = 99;
    EXPECT_EQ(tm_tensor_residency(rt_, t, &m), TM_OK) << tm_last_error();
    return m;
  }
  tm_stats Stats() {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK) << tm_last_error();
    return s;
  }
  std::vector<uint8_t> ReadAll(tm_tensor t) {
    std::vector<uint8_t> out(kBytes);
    EXPECT_EQ(tm_tensor_read(rt_, t, 0, out.data(), kBytes), TM_OK) << tm_last_error();
    return out;
  }

  ScopedEnv env_;
  TempDir dir_;
  tm_runtime rt_{0};
  std::vector<tm_tensor> others_;
};

TEST_F(RecomputeTest, DroppedUnderPressureThenRebuiltBitExactByAcquire) {
  Rebuild r{7};
  tm_tensor a = Make("act", 7);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  EXPECT_EQ(Residency(a), 0u) << "dropped, not written down";
  tm_stats s = Stats();
  EXPECT_EQ(s.recompute_drops, 1u);
  EXPECT_EQ(s.recompute_drop_bytes, kBytes);
  EXPECT_GE(s.evictions, 1u);
  EXPECT_EQ(s.bytes_moved[TM_TIER_HBM][TM_TIER_DRAM], 0u) << "nothing written down";
  EXPECT_EQ(s.tensors, 4u) << "a dropped tensor is still a live handle";
  EXPECT_EQ(r.calls, 0);

  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
      << tm_last_error();
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.tier, TM_TIER_HBM);
  EXPECT_EQ(r.bytes, kBytes);
  EXPECT_EQ(r.handle, a.bits);
  const std::vector<uint8_t> want = RandomBytes(kBytes, 7);
  EXPECT_EQ(std::memcmp(p, want.data(), kBytes), 0) << "the rebuilt bytes are served bit-exact";
  EXPECT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);
  EXPECT_EQ(Residency(a), TM_TIER_BIT(TM_TIER_HBM));
  EXPECT_EQ(ReadAll(a), want);
  EXPECT_EQ(r.calls, 1) << "valid again: no second rebuild";
  s = Stats();
  EXPECT_EQ(s.recomputes, 1u);
  EXPECT_EQ(s.recompute_failures, 0u);
  EXPECT_GT(s.recompute_ns, 0u);
}

TEST_F(RecomputeTest, ReadAndCopyOutRebuildTooAndTheFillersSurvive) {
  Rebuild r{11};
  tm_tensor a = Make("act", 11);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 0), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 11));
  EXPECT_EQ(r.calls, 1);
  for (size_t i = 0; i < others_.size(); ++i)
    EXPECT_EQ(ReadAll(others_[i]), RandomBytes(kBytes, 1000 + i));
  // Dropped again, then copy_out (no stream) rebuilds as well.
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  std::vector<uint8_t> out(kBytes);
  ASSERT_EQ(tm_tensor_copy_out(rt_, a, 0, out.data(), kBytes, nullptr), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_tensor_sync(rt_, a), TM_OK) << tm_last_error();
  EXPECT_EQ(out, RandomBytes(kBytes, 11));
  EXPECT_EQ(r.calls, 2);
  EXPECT_EQ(Stats().recompute_drops, 2u);
}

TEST_F(RecomputeTest, CostAboveTheRoundTripIsWrittenDown) {
  Rebuild r{3};
  tm_tensor a = Make("act", 3);
  // 1 MiB at 1 GB/s: 2.1 ms down and back; a rebuild of 10 s is not worth it.
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 10.0), TM_OK) << tm_last_error();
  Pressure();
  EXPECT_EQ(Residency(a), TM_TIER_BIT(TM_TIER_DRAM)) << "written down, not dropped";
  tm_stats s = Stats();
  EXPECT_EQ(s.recompute_drops, 0u);
  EXPECT_EQ(s.bytes_moved[TM_TIER_HBM][TM_TIER_DRAM], kBytes);
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 3));
  EXPECT_EQ(r.calls, 0);
}

TEST_F(RecomputeTest, DramCopyPricedAgainstNvme) {
  Rebuild r{5};
  tm_tensor a = Make("act", 5, TM_TIER_DRAM);
  ASSERT_EQ(Residency(a), TM_TIER_BIT(TM_TIER_DRAM));
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure(TM_TIER_DRAM);
  EXPECT_EQ(Residency(a), 0u);
  EXPECT_EQ(Stats().recompute_drops, 1u) << "dropped from DRAM, not written to NVMe";
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 5));
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.tier, TM_TIER_DRAM);
}

TEST_F(RecomputeTest, FailingCallbackIsAClearErrorAndServesNothing) {
  Rebuild r{9};
  r.result = TM_ERR_DEVICE;
  tm_tensor a = Make("act-failing", 9);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_ERR_DEVICE);
  const std::string msg = tm_last_error();
  EXPECT_NE(msg.find("recompute callback"), std::string::npos) << msg;
  EXPECT_NE(msg.find("act-failing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("TM_ERR_DEVICE"), std::string::npos) << msg;
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(Residency(a), 0u) << "the half-filled copy is no copy";
  std::vector<uint8_t> out(kBytes, 0x11);
  EXPECT_EQ(tm_tensor_read(rt_, a, 0, out.data(), kBytes), TM_ERR_DEVICE);
  EXPECT_EQ(out, std::vector<uint8_t>(kBytes, 0x11)) << "nothing served";
  // A value that is no tm_status is refused as such.
  r.result = static_cast<tm_status>(12345);
  EXPECT_EQ(tm_tensor_read(rt_, a, 0, out.data(), kBytes), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("12345"), std::string::npos) << tm_last_error();
  tm_stats s = Stats();
  EXPECT_EQ(s.recompute_failures, 3u);
  EXPECT_EQ(s.recomputes, 0u);
  // The cause gone, the next use rebuilds it.
  r.result = TM_OK;
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 9));
  EXPECT_EQ(r.calls, 4);
  EXPECT_EQ(Stats().recomputes, 1u);
}

TEST_F(RecomputeTest, ClearingRebuildsADroppedTensorFirst) {
  Rebuild r{21};
  tm_tensor a = Make("act", 21);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, nullptr, nullptr, 0), TM_OK) << tm_last_error();
  EXPECT_EQ(r.calls, 1);
  EXPECT_NE(Residency(a), 0u);
  // Cleared: pressure now writes it down.
  Pressure();
  EXPECT_NE(Residency(a), 0u);
  EXPECT_EQ(Stats().recompute_drops, 1u);
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 21));
  EXPECT_EQ(r.calls, 1);
  // A clear whose rebuild fails keeps the callback and says why.
  tm_tensor b = Make("act-b", 22);
  Rebuild rb{22};
  rb.result = TM_ERR_IO;
  ASSERT_EQ(tm_tensor_set_recompute(rt_, b, RebuildBytes, &rb, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(b), 0u);
  EXPECT_EQ(tm_tensor_set_recompute(rt_, b, nullptr, nullptr, 0), TM_ERR_IO);
  EXPECT_NE(std::string(tm_last_error()).find("callback stays"), std::string::npos)
      << tm_last_error();
  rb.result = TM_OK;
  EXPECT_EQ(ReadAll(b), RandomBytes(kBytes, 22));
}

TEST_F(RecomputeTest, DestroyingADroppedTensor) {
  Rebuild r{31};
  tm_tensor a = Make("act", 31);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  const uint64_t used = Stats().tiers[TM_TIER_HBM].used;
  ASSERT_EQ(tm_tensor_destroy(rt_, a), TM_OK) << tm_last_error();
  EXPECT_EQ(r.calls, 0);
  EXPECT_EQ(Stats().tensors, 3u);
  EXPECT_EQ(Stats().tiers[TM_TIER_HBM].used, used) << "it held nothing";
  uint32_t m = 0;
  EXPECT_EQ(tm_tensor_residency(rt_, a, &m), TM_ERR_INVALID_HANDLE);
}

TEST_F(RecomputeTest, WholeOverwritesNeedNoRebuildPartialOnesDo) {
  Rebuild r{41};
  tm_tensor a = Make("act", 41);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
      << tm_last_error();
  std::memset(p, 0x5A, kBytes);
  ASSERT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);
  EXPECT_EQ(r.calls, 0) << "overwritten whole: nothing to rebuild";
  EXPECT_EQ(ReadAll(a), std::vector<uint8_t>(kBytes, 0x5A));
  // Dropped again; a partial write rebuilds the rest first.
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  const uint8_t patch[4] = {1, 2, 3, 4};
  ASSERT_EQ(tm_tensor_write(rt_, a, 100, patch, sizeof patch), TM_OK) << tm_last_error();
  EXPECT_EQ(r.calls, 1);
  std::vector<uint8_t> want = RandomBytes(kBytes, 41);
  std::memcpy(want.data() + 100, patch, sizeof patch);
  EXPECT_EQ(ReadAll(a), want);
}

TEST_F(RecomputeTest, PrefetchSkipsADroppedTensor) {
  Rebuild r{51};
  tm_tensor a = Make("act", 51);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  const uint64_t dropped = Stats().prefetches_dropped;
  ASSERT_EQ(tm_tensor_prefetch(rt_, a, TM_TIER_HBM), TM_OK) << tm_last_error();
  EXPECT_EQ(tm_tensor_sync(rt_, a), TM_OK) << tm_last_error();
  EXPECT_EQ(r.calls, 0) << "never on tiermem's threads";
  EXPECT_EQ(Stats().prefetches_dropped, dropped + 1);
  // Offloading a dropped tensor has nothing to move.
  EXPECT_EQ(tm_tensor_offload(rt_, a, TM_TIER_NVME), TM_OK) << tm_last_error();
  EXPECT_EQ(tm_tensor_sync(rt_, a), TM_OK) << tm_last_error();
  EXPECT_EQ(Residency(a), 0u);
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 51));
}

// A rebuild that reads its input from another tiermem tensor, as a layer's forward reads the
// layer's input: the callback runs outside the runtime's lock (inside it, this would deadlock),
// and its input is brought back from wherever pressure put it.
struct FromInput {
  tm_runtime rt;
  tm_tensor input;
  int calls = 0;
};

tm_status RebuildFromInput(void* user, tm_tensor, tm_tier, void* dst, uint64_t bytes, void*) {
  auto* f = static_cast<FromInput*>(user);
  ++f->calls;
  tm_status s = tm_tensor_read(f->rt, f->input, 0, dst, bytes);
  if (s != TM_OK) return s;
  for (uint64_t i = 0; i < bytes; ++i) static_cast<uint8_t*>(dst)[i] ^= 0x5A;  // the "layer"
  return TM_OK;
}

TEST_F(RecomputeTest, CallbackMayUseOtherTensors) {
  tm_tensor input = Make("input", 81);
  tm_tensor a = Make("act", 0);
  std::vector<uint8_t> want = RandomBytes(kBytes, 81);
  for (uint8_t& b : want) b ^= 0x5A;
  ASSERT_EQ(tm_tensor_write(rt_, a, 0, want.data(), kBytes), TM_OK) << tm_last_error();
  FromInput f{rt_, input};
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildFromInput, &f, 1e-6), TM_OK) << tm_last_error();
  Pressure();  // evicts the input (written down) and the activation (dropped)
  ASSERT_EQ(Residency(a), 0u);
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
      << tm_last_error();
  EXPECT_EQ(f.calls, 1);
  EXPECT_EQ(std::memcmp(p, want.data(), kBytes), 0);
  EXPECT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);
}

// A callback that calls tiermem with its own tensor is refused at once (TM_ERR_BUSY, naming the
// tensor) instead of waiting for itself forever; it then rebuilds as it should, and the
// operation that asked for the bytes succeeds.
struct SelfUse {
  tm_runtime rt{0};
  uint64_t seed = 0;
  std::vector<tm_status> seen;
  std::string message;
};

tm_status RebuildUsingItself(void* user, tm_tensor self, tm_tier tier, void* dst, uint64_t bytes,
                             void* stream) {
  auto* u = static_cast<SelfUse*>(user);
  std::vector<uint8_t> buf(bytes);
  u->seen.push_back(tm_tensor_read(u->rt, self, 0, buf.data(), bytes));
  u->message = tm_last_error();
  void* p = nullptr;
  u->seen.push_back(tm_tensor_acquire(u->rt, self, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  u->seen.push_back(tm_tensor_write(u->rt, self, 0, buf.data(), bytes));
  u->seen.push_back(tm_tensor_sync(u->rt, self));
  u->seen.push_back(tm_tensor_destroy(u->rt, self));
  Rebuild r{u->seed};
  return RebuildBytes(&r, self, tier, dst, bytes, stream);
}

TEST_F(RecomputeTest, CallbackUsingItsOwnTensorIsRefusedNotDeadlocked) {
  tm_tensor a = Make("act", 23);
  SelfUse u;
  u.rt = rt_;
  u.seed = 23;
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildUsingItself, &u, 1e-6), TM_OK)
      << tm_last_error();
  Pressure();
  ASSERT_EQ(Residency(a), 0u);
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 23));
  EXPECT_EQ(u.seen, std::vector<tm_status>(5, TM_ERR_BUSY));
  EXPECT_NE(u.message.find("\"act\""), std::string::npos) << u.message;
  EXPECT_NE(u.message.find("recompute callback"), std::string::npos) << u.message;
  EXPECT_EQ(Stats().recomputes, 1u);
}

// The trace shows the drop and the rebuild on their own tracks.
TEST_F(RecomputeTest, TraceHasTheDropAndTheRebuild) {
  ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK);
  rt_ = tm_runtime{0};
  const std::string trace = dir_.path() + "/trace.json";
  tm_config c = testing::SmallConfig(dir_.path());
  c.device = TM_DEVICE_EMULATED;
  c.hbm_bytes = 3 * kBytes;
  c.dram_bytes = 3 * kBytes;
  c.prefetch_depth = 0;
  c.log_level = TM_LOG_ERROR;
  c.trace = trace.c_str();
  ASSERT_EQ(tm_runtime_create(&c, &rt_), TM_OK) << tm_last_error();
  Rebuild r{71};
  tm_tensor a = Make("traced-act", 71);
  ASSERT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, 1e-6), TM_OK) << tm_last_error();
  Pressure();
  EXPECT_EQ(ReadAll(a), RandomBytes(kBytes, 71));
  ASSERT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error();
  rt_ = tm_runtime{0};
  const std::string json = testing::ReadText(trace);
  EXPECT_NE(json.find("\"name\":\"recompute drops\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"traced-act\",\"cat\":\"recompute drop\""), std::string::npos)
      << json.substr(0, 2000);
  EXPECT_NE(json.find("\"name\":\"traced-act\",\"cat\":\"recompute\""), std::string::npos);
}

TEST_F(RecomputeTest, BadArgumentsAreRefusedByName) {
  Rebuild r{61};
  tm_tensor a = Make("act", 61);
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(tm_tensor_set_recompute(rt_, a, RebuildBytes, &r, bad), TM_ERR_INVALID_ARGUMENT)
        << bad;
    EXPECT_NE(std::string(tm_last_error()).find("cost_seconds"), std::string::npos)
        << tm_last_error();
  }
  EXPECT_EQ(tm_tensor_set_recompute(rt_, a, nullptr, nullptr, 1.0), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tm_last_error()).find("fn is NULL"), std::string::npos) << tm_last_error();
  EXPECT_EQ(tm_tensor_set_recompute(rt_, tm_tensor{0}, RebuildBytes, &r, 1.0),
            TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(tm_tensor_set_recompute(rt_, tm_tensor{a.bits ^ 0x100000000ull}, RebuildBytes, &r, 1.0),
            TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(tm_tensor_set_recompute(tm_runtime{0}, a, RebuildBytes, &r, 1.0),
            TM_ERR_INVALID_HANDLE);
  // None of them set anything: pressure writes it down.
  Pressure();
  EXPECT_NE(Residency(a), 0u);
  EXPECT_EQ(Stats().recompute_drops, 0u);
}

}  // namespace
}  // namespace tiermem
