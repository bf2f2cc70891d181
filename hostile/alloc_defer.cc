// Hostile probe: with device_alloc/device_free, copy_out then destroy at once: is the HBM block
// handed back with device_free once tm_runtime_sync returns (docs: freed when its tensor is
// destroyed)?
#include <atomic>

#include "common.h"
static std::atomic<long> outstanding{0}, allocs{0}, frees{0};
static void* a(void*, size_t b, int32_t, void*) {
  allocs++;
  outstanding += b;
  return malloc(b);
}
static void f(void*, void* p, size_t b, int32_t, void*) {
  frees++;
  outstanding -= b;
  free(p);
}
int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1])
                      : 0;  // 0: copy_out then destroy; 1: release_on_stream(0x1) then destroy
  tm_config c = TM_CONFIG_INIT;
  c.device_alloc = a;
  c.device_free = f;
  tm_runtime rt = make_rt(64 << 20, 8 << 20, 64 << 20, &c);
  std::vector<unsigned char> src(100000, 3), dst(100000);
  for (int i = 0; i < 20; i++) {
    tm_tensor x = make_t(rt, 100000, TM_TIER_HBM);
    EXPECT_ST(tm_tensor_write(rt, x, 0, src.data(), 100000), TM_OK);
    if (mode == 0) {
      EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), 100000, nullptr), TM_OK);
    } else {
      void* p;
      EXPECT_ST(tm_tensor_acquire(rt, x, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
      EXPECT_ST(tm_tensor_release_on_stream(rt, x, TM_TIER_HBM, (void*)0x1), TM_OK);
    }
    EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
  }
  EXPECT_ST(tm_runtime_sync(rt), TM_OK);
  usleep(100000);
  tm_stats st = TM_STATS_INIT;
  tm_runtime_stats(rt, &st);
  CHECK(outstanding == 0 && st.tiers[0].used == 0,
        "mode %d: all 20 tensors destroyed and synced, yet %ld bytes still held from device_alloc "
        "(%ld allocs, %ld frees), stats used %llu",
        mode, (long)outstanding, (long)allocs, (long)frees, (unsigned long long)st.tiers[0].used);
  EXPECT_ST(tm_runtime_destroy(rt), TM_OK);
  CHECK(outstanding == 0 && allocs == frees,
        "after runtime_destroy: outstanding %ld allocs %ld frees %ld", (long)outstanding,
        (long)allocs, (long)frees);
  return finish("alloc_defer");
}
