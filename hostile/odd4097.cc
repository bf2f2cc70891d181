// Hostile probe: two copy_in's into an HBM tensor of 4097 bytes, then copy_out: does it round-trip?
#include "common.h"
int main(int argc, char** argv) {
  uint64_t sz = argc > 1 ? strtoull(argv[1], 0, 0) : 4097;
  int home = argc > 2 ? atoi(argv[2]) : 0;
  int sync_between = argc > 3 ? atoi(argv[3]) : 0;
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  tm_tensor x = make_t(rt, sz, home);
  std::vector<unsigned char> src(sz), mid(sz - 2), dst(sz);
  fill(src, 1);
  fill(mid, 99);
  EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), sz, nullptr), TM_OK);
  if (sync_between) EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
  EXPECT_ST(tm_tensor_copy_in(rt, x, 1, mid.data(), sz - 2, nullptr), TM_OK);
  memcpy(src.data() + 1, mid.data(), sz - 2);
  EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), sz, nullptr), TM_OK);
  EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
  size_t bad = 0, first = SIZE_MAX;
  for (size_t i = 0; i < sz; i++)
    if (src[i] != dst[i]) {
      bad++;
      if (first == SIZE_MAX) first = i;
    }
  CHECK(bad == 0, "%zu bytes differ, first at %zu (want %d got %d)", bad, first,
        bad ? src[first] : 0, bad ? dst[first] : 0);
  // Does a plain read agree with copy_out?
  std::vector<unsigned char> r(sz);
  EXPECT_ST(tm_tensor_read(rt, x, 0, r.data(), sz), TM_OK);
  CHECK(memcmp(r.data(), src.data(), sz) == 0, "read differs too");
  EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
  EXPECT_ST(tm_runtime_destroy(rt), TM_OK);
  return finish("odd4097");
}
