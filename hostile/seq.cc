// Hostile probe: odd-size round trips in HBM after earlier tensors were offloaded to NVMe and
// destroyed: find which prior step makes a later round trip come back wrong.
#include "common.h"
static bool trip(tm_runtime rt, uint64_t sz, int home, bool offload, bool twostep) {
  tm_tensor x = make_t(rt, sz, home);
  std::vector<unsigned char> src(sz), dst(sz, 0xCD);
  fill(src, (unsigned)sz + home);
  EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), sz, nullptr), TM_OK);
  if (twostep && sz > 2) {
    std::vector<unsigned char> mid(sz - 2);
    fill(mid, 99);
    EXPECT_ST(tm_tensor_copy_in(rt, x, 1, mid.data(), sz - 2, nullptr), TM_OK);
    memcpy(src.data() + 1, mid.data(), sz - 2);
  }
  EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), sz, nullptr), TM_OK);
  EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
  size_t bad = 0, first = SIZE_MAX;
  for (size_t i = 0; i < sz; i++)
    if (src[i] != dst[i]) {
      bad++;
      if (first == SIZE_MAX) first = i;
    }
  if (bad)
    printf("size %llu home %d: %zu bytes differ, first at %zu (want %d got %d)\n",
           (unsigned long long)sz, home, bad, first, src[first], dst[first]);
  if (offload) {
    EXPECT_ST(tm_tensor_offload(rt, x, TM_TIER_NVME), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
  }
  EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
  return bad == 0;
}
int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  bool offload = mode & 1, twostep = mode & 2;
  const uint64_t pre = argc > 2 ? strtoull(argv[2], 0, 0) : 4095;
  trip(rt, pre, 0, offload, twostep);
  bool ok = trip(rt, 4097, 0, offload, twostep);
  CHECK(ok, "4097 after %llu mode %d", (unsigned long long)pre, mode);
  tm_runtime_destroy(rt);
  return finish("seq");
}
