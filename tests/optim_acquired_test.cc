// The CPU Adam never changes a state tensor that a caller holds acquired: tm_adam_step_buckets
// and tm_adam_step_groups refuse it with TM_ERR_BUSY naming the bucket and the tensor before
// anything moves, and the same step succeeds once the caller releases it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace {

using tiermem::testing::SmallConfig;
using tiermem::testing::TempDir;

std::string LastError() { return tm_last_error(); }

constexpr size_t kN = 1000;

struct Case {
  tm_tier home;
  tm_tier tier;  // where the caller acquires it
  tm_access access;
};

std::string Describe(const Case& c) {
  return std::string("home ") + tm_tier_name(c.home) + ", acquired in " + tm_tier_name(c.tier) +
         (c.access == TM_ACCESS_READ    ? " for reading"
          : c.access == TM_ACCESS_WRITE ? " for writing"
                                        : " for reading and writing");
}

TEST(OptimAcquired, AcquiredStateIsRefusedAndLeftAsItWas) {
  const Case cases[] = {
      {TM_TIER_DRAM, TM_TIER_DRAM, TM_ACCESS_READ},
      {TM_TIER_DRAM, TM_TIER_DRAM, TM_ACCESS_WRITE},
      {TM_TIER_DRAM, TM_TIER_DRAM, TM_ACCESS_READ_WRITE},
      {TM_TIER_NVME, TM_TIER_DRAM, TM_ACCESS_READ},
      {TM_TIER_NVME, TM_TIER_DRAM, TM_ACCESS_WRITE},
      {TM_TIER_NVME, TM_TIER_DRAM, TM_ACCESS_READ_WRITE},
      {TM_TIER_NVME, TM_TIER_HBM, TM_ACCESS_READ},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(Describe(k));
    TempDir dir;
    tm_config cfg = SmallConfig(dir.path());
    tm_runtime rt{0};
    ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
    tm_adam_config c = TM_ADAM_CONFIG_INIT;
    c.threads = 1;
    tm_adam adam{0}, host{0};
    ASSERT_EQ(tm_adam_create(rt, &c, &adam), TM_OK) << LastError();
    ASSERT_EQ(tm_adam_create({0}, &c, &host), TM_OK) << LastError();
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 12 * kN;
    d.cls = TM_CLASS_OPTIMIZER_STATE;
    d.home_tier = k.home;
    d.name = "held state";
    tm_tensor t{0};
    ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << LastError();
    std::vector<float> state(3 * kN), grad(kN, 0.5f);
    for (size_t i = 0; i < kN; ++i) state[i] = 1.0f + 0.001f * static_cast<float>(i);
    ASSERT_EQ(tm_tensor_write(rt, t, 0, state.data(), d.bytes), TM_OK) << LastError();
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt, t, k.tier, k.access, nullptr, &p), TM_OK) << LastError();
    auto* held = static_cast<float*>(p);
    if (k.access != TM_ACCESS_READ) {
      for (size_t i = 0; i < kN; ++i) state[i] = 2.0f - 0.001f * static_cast<float>(i);
      std::memcpy(held, state.data(), d.bytes);  // the caller's new contents
    }
    const tm_adam_bucket bucket = {t, kN, grad.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32};
    size_t done = 99;
    EXPECT_EQ(tm_adam_step_buckets(adam, 1, 1.0f, &bucket, 1, &done), TM_ERR_BUSY);
    EXPECT_NE(LastError().find("bucket 0"), std::string::npos) << LastError();
    EXPECT_NE(LastError().find("held state"), std::string::npos) << LastError();
    EXPECT_EQ(done, 0u);
    tm_adam_group group = {nullptr, 1, &bucket, 1};
    done = 99;
    EXPECT_EQ(tm_adam_step_groups(adam, 1.0f, &group, 1, &done), TM_ERR_BUSY);
    EXPECT_NE(LastError().find("held state"), std::string::npos) << LastError();
    EXPECT_EQ(done, 0u);
    EXPECT_EQ(std::memcmp(held, state.data(), d.bytes), 0)
        << "the bytes changed under the caller's pointer";
    ASSERT_EQ(tm_tensor_release(rt, t, k.tier), TM_OK) << LastError();
    std::vector<float> back(3 * kN);
    ASSERT_EQ(tm_tensor_read(rt, t, 0, back.data(), d.bytes), TM_OK) << LastError();
    EXPECT_EQ(back, state) << "a refused step changed the state";
    // Released: the same step is taken, and gives what the host step gives.
    ASSERT_EQ(tm_adam_step_buckets(adam, 1, 1.0f, &bucket, 1, &done), TM_OK) << LastError();
    EXPECT_EQ(done, 1u);
    float* s = state.data();
    tm_adam_span span = {s,       s + kN,       s + 2 * kN, nullptr, grad.data(), TM_DTYPE_F32,
                         nullptr, TM_DTYPE_F32, kN};
    ASSERT_EQ(tm_adam_step(host, 1, 1.0f, &span, 1), TM_OK) << LastError();
    ASSERT_EQ(tm_tensor_read(rt, t, 0, back.data(), d.bytes), TM_OK) << LastError();
    EXPECT_EQ(back, state) << "the step after the release";
    EXPECT_EQ(tm_adam_destroy(adam), TM_OK);
    EXPECT_EQ(tm_adam_destroy(host), TM_OK);
    EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
  }
}

}  // namespace
