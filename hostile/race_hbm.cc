// Hostile probe: copy_in (whole), copy_in (middle), copy_out, sync on an HBM tensor, repeated:
// the copy_out must see both writes (docs: calls on one tensor keep their order).
#include "common.h"
int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  int mode = argc > 2 ? atoi(argv[2]) : 3;  // bit0: second copy_in, bit1: fresh tensor each time
  int home = argc > 3 ? atoi(argv[3]) : 0;
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  int badruns = 0;
  tm_tensor keep = {0};
  for (int it = 0; it < iters; it++) {
    uint64_t sz = 3 + (it % 7) * 600;
    tm_tensor x = (mode & 2) || !keep.bits ? make_t(rt, 4096, home) : keep;
    if (!(mode & 2)) keep = x;
    std::vector<unsigned char> src(sz), mid(sz), dst(sz, 0xCD);
    fill(src, it);
    fill(mid, it + 1000);
    EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), sz, nullptr), TM_OK);
    if (mode & 1) {
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
    if (bad) {
      if (badruns < 5)
        printf("iter %d size %llu: %zu bytes differ, first at %zu (want %d got %d)\n", it,
               (unsigned long long)sz, bad, first, src[first], dst[first]);
      badruns++;
    }
    if (mode & 2) EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
  }
  CHECK(badruns == 0, "%d of %d round trips came back wrong", badruns, iters);
  tm_runtime_destroy(rt);
  return finish("race_hbm");
}
