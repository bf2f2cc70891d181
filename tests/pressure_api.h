// The fixture of the memory-pressure suites that drive the C API (pressure_schedule_test,
// pressure_reports_test, do_no_harm_test, demand_wait_test, fragmentation_test): a runtime on
// the emulated device with the budgets and prefetch depth a test gives, and its tensors.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem::testing {

class PressureApi : public ::testing::Test {
 public:
  void Open(uint64_t hbm, uint64_t dram, int depth) {
    tm_config c = SmallConfig(dir_.path());
    c.hbm_bytes = hbm;
    c.dram_bytes = dram;
    c.prefetch_depth = depth;
    ASSERT_EQ(tm_runtime_create(&c, &rt_), TM_OK) << tm_last_error();
  }
  void TearDown() override {
    if (rt_.bits != 0) tm_runtime_destroy(rt_);
  }
  tm_tensor Make(uint64_t bytes, const char* name, tm_tensor_class cls = TM_CLASS_ACTIVATION,
                 int home = TM_TIER_BY_PLACEMENT) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.name = name;
    d.cls = cls;
    d.home_tier = home;
    tm_tensor t{};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  tm_stats Stats() {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    return s;
  }
  // TIERMEM_HBM_LAYOUT for the runtime Open creates next ("slab", "mapped").
  void UseLayout(const char* layout) { env_.Set("TIERMEM_HBM_LAYOUT", layout); }
  ScopedEnv env_;
  TempDir dir_;
  tm_runtime rt_{};
};

}  // namespace tiermem::testing
