// Hostile probe: copy_in + copy_out then tm_tensor_destroy at once (no sync): is every copy freed?
#include "common.h"
int main(int argc, char** argv) {
  int home = argc > 1 ? atoi(argv[1]) : 0;
  int iters = argc > 2 ? atoi(argv[2]) : 50;
  int what = argc > 3 ? atoi(argv[3]) : 3;  // bit0: copy_in, bit1: copy_out
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  std::vector<unsigned char> src(100000), dst(100000);
  for (int i = 0; i < iters; i++) {
    tm_tensor x = make_t(rt, 100000, home);
    fill(src, i);
    if (what & 1)
      EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), 100000, nullptr), TM_OK);
    else
      EXPECT_ST(tm_tensor_write(rt, x, 0, src.data(), 100000), TM_OK);
    if (what & 2) EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), 100000, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
  }
  EXPECT_ST(tm_runtime_sync(rt), TM_OK);
  tm_stats st = TM_STATS_INIT;
  tm_runtime_stats(rt, &st);
  CHECK(st.tensors == 0 && st.tiers[0].used == 0 && st.tiers[1].used == 0 && st.tiers[2].used == 0,
        "home %d what %d: tensors %llu used hbm %llu dram %llu nvme %llu", home, what,
        (unsigned long long)st.tensors, (unsigned long long)st.tiers[0].used,
        (unsigned long long)st.tiers[1].used, (unsigned long long)st.tiers[2].used);
  usleep(200000);
  tm_runtime_stats(rt, &st);
  printf("after 200 ms: used hbm %llu dram %llu\n", (unsigned long long)st.tiers[0].used,
         (unsigned long long)st.tiers[1].used);
  {
    tm_tensor y = make_t(rt, 256, 0);
    unsigned char b[256] = {1};
    EXPECT_ST(tm_tensor_write(rt, y, 0, b, 256), TM_OK);
    EXPECT_ST(tm_tensor_destroy(rt, y), TM_OK);
    tm_runtime_stats(rt, &st);
    tm_tensor z = make_t(rt, 900000, 0);
    std::vector<unsigned char> big(900000, 7);
    EXPECT_ST(tm_tensor_write(rt, z, 0, big.data(), 900000), TM_OK);
    EXPECT_ST(tm_tensor_destroy(rt, z), TM_OK);
    tm_runtime_stats(rt, &st);
    printf("after a 900000-byte HBM write+destroy: used hbm %llu\n",
           (unsigned long long)st.tiers[0].used);
    printf("after another HBM alloc+free: used hbm %llu tensors %llu\n",
           (unsigned long long)st.tiers[0].used, (unsigned long long)st.tensors);
  }
  tm_runtime_destroy(rt);
  return finish("leak_destroy");
}
