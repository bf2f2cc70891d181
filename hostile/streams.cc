// Hostile probe: tm_tensor_release_on_stream and copy_in/copy_out with bad stream handles.
#include <sys/mman.h>

#include "common.h"
int main() {
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  tm_tensor t = make_t(rt, 4096, TM_TIER_HBM, "pinned");
  void* p = nullptr;
  int on_stack = 42;
  void* heap = malloc(64);
  memset(heap, 0, 64);
  void* unmapped = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* bads[] = {(void*)0x3,
                  (void*)0x4,
                  (void*)0x10,
                  (void*)0xdeadbeef,
                  &on_stack,
                  heap,
                  unmapped,
                  (void*)UINTPTR_MAX,
                  (void*)(uintptr_t)0x7fffffffffffull,
                  (void*)&tm_runtime_create,
                  (void*)&rt};
  EXPECT_ST(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK);
  for (void* s : bads) {
    tm_status st = tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, s);
    printf("release_on_stream(%p) -> %s: %s\n", s, tm_status_string(st), tm_last_error());
    CHECK(st == TM_ERR_INVALID_ARGUMENT, "stream %p", s);
    // Pin kept?
    EXPECT_ST(tm_tensor_destroy(rt, t), TM_ERR_BUSY);
  }
  CHECK(on_stack == 42, "stack int written");
  // Bad streams on acquire and copies too.
  for (void* s : bads) {
    void* q = nullptr;
    tm_tensor u = make_t(rt, 4096, TM_TIER_DRAM);
    unsigned char buf[4096] = {1};
    EXPECT_ST(tm_tensor_copy_in(rt, u, 0, buf, 4096, s), TM_ERR_INVALID_ARGUMENT);
    EXPECT_ST(tm_tensor_copy_out(rt, u, 0, buf, 4096, s), TM_ERR_INVALID_ARGUMENT);
    EXPECT_ST(tm_tensor_write(rt, u, 0, buf, 4096), TM_OK);
    EXPECT_ST(tm_tensor_acquire(rt, u, TM_TIER_HBM, TM_ACCESS_READ, s, &q),
              TM_ERR_INVALID_ARGUMENT);
    EXPECT_ST(tm_tensor_destroy(rt, u), TM_OK);
  }
  // 0x1 and 0x2 name the emulated default stream: they work.
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0x1), TM_OK);
  EXPECT_ST(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, (void*)0x2, &p), TM_OK);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0x2), TM_OK);
  // A second release (no pin left) is INVALID_ARGUMENT, with any stream.
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0x1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0xdeadbeef),
            TM_ERR_INVALID_ARGUMENT);
  // Wrong tier, bad tier values.
  EXPECT_ST(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_DRAM, (void*)0x1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_NVME, (void*)0x1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, (tm_tier)7, (void*)0x1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, (tm_tier)-1, (void*)0x1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, nullptr), TM_OK);
  // Destroyed tensor, and release on a stream then destroy then runtime destroy.
  EXPECT_ST(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0x1), TM_OK);
  EXPECT_ST(tm_tensor_destroy(rt, t), TM_OK);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0x1), TM_ERR_INVALID_HANDLE);
  EXPECT_ST(tm_runtime_sync(rt), TM_OK);
  tm_stats st = TM_STATS_INIT;
  tm_runtime_stats(rt, &st);
  CHECK(st.tiers[0].used == 0, "hbm used %llu after destroy + sync",
        (unsigned long long)st.tiers[0].used);
  EXPECT_ST(tm_runtime_destroy(rt), TM_OK);
  EXPECT_ST(tm_tensor_release_on_stream(rt, t, TM_TIER_HBM, (void*)0x1), TM_ERR_INVALID_HANDLE);
  free(heap);
  return finish("streams");
}
