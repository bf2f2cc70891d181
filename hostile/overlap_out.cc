// Hostile probe: copy_out of a DRAM tensor into its own pinned DRAM copy shifted by one byte.
#include "common.h"
int main() {
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  tm_tensor t = make_t(rt, 65536, TM_TIER_DRAM, "self");
  std::vector<unsigned char> src(65536);
  fill(src, 3);
  EXPECT_ST(tm_tensor_write(rt, t, 0, src.data(), 65536), TM_OK);
  void* q = nullptr;
  EXPECT_ST(tm_tensor_acquire(rt, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &q), TM_OK);
  tm_status s = tm_tensor_copy_out(rt, t, 0, (char*)q + 1, 4096, nullptr);
  printf("copy_out into own pinned copy + 1 -> %s %s\n", tm_status_string(s),
         s ? tm_last_error() : "");
  tm_tensor_sync(rt, t);
  EXPECT_ST(tm_tensor_release(rt, t, TM_TIER_DRAM), TM_OK);
  tm_runtime_destroy(rt);
  return finish("overlap_out");
}
