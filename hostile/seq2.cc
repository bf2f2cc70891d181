// Hostile probe: the copy_edges loop body (round trip, offload to NVMe, copy_out a tail from NVMe,
// copy_in the last byte into the NVMe-only tensor, read, destroy), repeated on HBM-home tensors.
#include "common.h"
int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 200;
  int variant = argc > 2 ? atoi(argv[2]) : 0;
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  int bad_rt = 0;
  for (int it = 0; it < iters; it++) {
    uint64_t sz = (it % 2) ? 3 : 1;
    tm_tensor x = make_t(rt, sz, TM_TIER_HBM);
    std::vector<unsigned char> src(sz), dst(sz + 16, 0xCD);
    fill(src, (unsigned)it);
    EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), sz, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), sz, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
    if (memcmp(src.data(), dst.data(), sz) != 0) {
      if (bad_rt++ < 5)
        printf("iter %d: round trip differs: want %02x got %02x\n", it, src[0], dst[0]);
    }
    if (variant == 0) {
      EXPECT_ST(tm_tensor_offload(rt, x, TM_TIER_NVME), TM_OK);
      EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
      unsigned char last = 0x5A;
      EXPECT_ST(tm_tensor_copy_in(rt, x, sz - 1, &last, 1, nullptr), TM_OK);
      EXPECT_ST(tm_tensor_read(rt, x, 0, dst.data(), sz), TM_OK);
    } else if (variant == 1) {
      EXPECT_ST(tm_tensor_offload(rt, x, TM_TIER_NVME), TM_OK);
      EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
    } else if (variant == 2) {
      EXPECT_ST(tm_tensor_offload(rt, x, TM_TIER_DRAM), TM_OK);
      EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
    }
    EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
  }
  CHECK(bad_rt == 0, "%d of %d round trips wrong", bad_rt, iters);
  tm_stats st = TM_STATS_INIT;
  tm_runtime_stats(rt, &st);
  CHECK(st.tiers[0].used == 0 && st.tiers[1].used == 0 && st.tiers[2].used == 0,
        "leak: used hbm %llu dram %llu nvme %llu", (unsigned long long)st.tiers[0].used,
        (unsigned long long)st.tiers[1].used, (unsigned long long)st.tiers[2].used);
  tm_runtime_destroy(rt);
  return finish("seq2");
}
