// Hostile probe: tm_tensor_sync must not return before this tensor's copy_out has landed in dst,
// while another thread works on other tensors (mode 0: tm_runtime_sync in a loop; 1: create,
// copy_in, destroy other tensors; 2: both).
#include <atomic>
#include <thread>

#include "common.h"
int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  int iters = argc > 2 ? atoi(argv[2]) : 20000;
  int home = argc > 3 ? atoi(argv[3]) : 0;
  const uint64_t n = 65536;
  tm_runtime rt = make_rt(4 << 20, 8 << 20, 32 << 20);
  std::atomic<bool> stop{false};
  std::thread other([&] {
    std::vector<unsigned char> b(n, 1);
    while (!stop) {
      if (mode == 0 || mode == 2) tm_runtime_sync(rt);
      if (mode == 1 || mode == 2) {
        tm_tensor o = make_t(rt, n, home);
        tm_tensor_copy_in(rt, o, 0, b.data(), n, nullptr);
        tm_tensor_sync(rt, o);
        tm_tensor_destroy(rt, o);
      }
    }
  });
  tm_tensor t = make_t(rt, n, home, "mine");
  std::vector<uint64_t> src(n / 8), dst(n / 8);
  int early = 0;
  for (int it = 1; it <= iters; it++) {
    std::fill(src.begin(), src.end(), (uint64_t)it);
    EXPECT_ST(tm_tensor_copy_in(rt, t, 0, src.data(), n, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, t), TM_OK);
    std::fill(dst.begin(), dst.end(), ~0ull);
    EXPECT_ST(tm_tensor_copy_out(rt, t, 0, dst.data(), n, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, t), TM_OK);
    if (dst[0] != (uint64_t)it || dst[n / 8 - 1] != (uint64_t)it) {
      if (early++ < 3)
        printf("iter %d: after copy_out + tm_tensor_sync == TM_OK, dst[0] = %llx (want %x)\n", it,
               (unsigned long long)dst[0], it);
    }
  }
  stop = true;
  other.join();
  CHECK(early == 0,
        "mode %d home %d: %d of %d copy_outs had not landed when tm_tensor_sync returned TM_OK",
        mode, home, early, iters);
  tm_tensor_destroy(rt, t);
  tm_runtime_destroy(rt);
  return finish("sync_race");
}
