// Hostile probe: tm_tensor_copy_in / copy_out edges (ranges at uint64 edges, odd sizes, every tier,
// device pointers of the emulated device, overlapping ranges, copy_in into a pinned copy).
#include "common.h"

int main() {
  tm_runtime rt = make_rt(1 << 20, 8 << 20, 64 << 20);
  if (!rt.bits) return 2;
  tm_tensor t = make_t(rt, 4097, TM_TIER_HBM, "odd");
  std::vector<unsigned char> a(8192), b(8192);
  fill(a, 1);
  // Range edges.
  EXPECT_ST(tm_tensor_copy_in(rt, t, UINT64_MAX, a.data(), 1, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_in(rt, t, 1, a.data(), UINT64_MAX, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_in(rt, t, UINT64_MAX, a.data(), UINT64_MAX, nullptr),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_in(rt, t, 4097, a.data(), 1, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_in(rt, t, 4096, a.data(), 2, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_out(rt, t, UINT64_MAX, b.data(), 1, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_out(rt, t, 2, b.data(), UINT64_MAX - 1, nullptr),
            TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_out(rt, t, 0, b.data(), 4098, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_in(rt, t, 0, nullptr, 1, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_ST(tm_tensor_copy_out(rt, t, 0, nullptr, 1, nullptr), TM_ERR_INVALID_ARGUMENT);
  // bytes == 0: fine with NULL, and at offset == size, and past it?
  EXPECT_ST(tm_tensor_copy_in(rt, t, 0, nullptr, 0, nullptr), TM_OK);
  EXPECT_ST(tm_tensor_copy_out(rt, t, 0, nullptr, 0, nullptr), TM_OK);
  EXPECT_ST(tm_tensor_copy_in(rt, t, 4097, a.data(), 0, nullptr), TM_OK);
  {
    tm_status s = tm_tensor_copy_in(rt, t, UINT64_MAX, a.data(), 0, nullptr);
    printf("info copy_in(offset=UINT64_MAX, bytes=0) -> %s %s\n", tm_status_string(s),
           tm_last_error());
  }
  // Bad handles.
  EXPECT_ST(tm_tensor_copy_in(rt, tm_tensor{0}, 0, a.data(), 1, nullptr), TM_ERR_INVALID_HANDLE);
  EXPECT_ST(tm_tensor_copy_in(rt, tm_tensor{rt.bits}, 0, a.data(), 1, nullptr),
            TM_ERR_INVALID_HANDLE);
  EXPECT_ST(tm_tensor_copy_out(tm_runtime{t.bits}, t, 0, b.data(), 1, nullptr),
            TM_ERR_INVALID_HANDLE);
  EXPECT_ST(tm_tensor_copy_out(rt, tm_tensor{0xdeadbeefdeadbeefull}, 0, b.data(), 1, nullptr),
            TM_ERR_INVALID_HANDLE);

  // Never-written tensor reads zeros.
  memset(b.data(), 0xAA, b.size());
  EXPECT_ST(tm_tensor_copy_out(rt, t, 0, b.data(), 4097, nullptr), TM_OK);
  EXPECT_ST(tm_tensor_sync(rt, t), TM_OK);
  for (int i = 0; i < 4097; i++)
    if (b[i] != 0) {
      CHECK(false, "never-written byte %d = %d", i, b[i]);
      break;
    }
  CHECK(b[4097] == 0xAA, "copy_out wrote past the range");

  // Odd-size round trips in every tier, with odd offsets.
  const uint64_t sizes[] = {1, 3, 255, 4095, 4097, 65537, 1048577};
  for (int home = 0; home < 3; home++) {
    for (uint64_t sz : sizes) {
      if (home == 0 && sz > (1 << 20)) continue;  // larger than the HBM budget
      tm_tensor x = make_t(rt, sz, home);
      std::vector<unsigned char> src(sz), dst(sz + 16, 0xCD);
      fill(src, (unsigned)sz + home);
      EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), sz, nullptr), TM_OK);
      std::vector<unsigned char> mid(sz);  // lives until the sync below (src must not change)
      if (sz > 2) {                        // rewrite the middle at an odd offset
        fill(mid, 99);
        EXPECT_ST(tm_tensor_copy_in(rt, x, 1, mid.data(), sz - 2, nullptr), TM_OK);
        memcpy(src.data() + 1, mid.data(), sz - 2);
      }
      EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), sz, nullptr), TM_OK);
      EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
      CHECK(memcmp(src.data(), dst.data(), sz) == 0, "home %d size %llu round trip differs", home,
            (unsigned long long)sz);
      CHECK(dst[sz] == 0xCD, "copy_out overran dst (home %d size %llu)", home,
            (unsigned long long)sz);
      // Offload to NVMe, then copy_out a tail straight from NVMe.
      if (sz <= (1 << 20)) {
        EXPECT_ST(tm_tensor_offload(rt, x, TM_TIER_NVME), TM_OK);
        EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
        uint32_t m = 0;
        tm_tensor_residency(rt, x, &m);
        CHECK(m == TM_TIER_BIT(TM_TIER_NVME), "after offload residency %u", m);
        uint64_t off = sz / 2;
        memset(dst.data(), 0xCD, dst.size());
        EXPECT_ST(tm_tensor_copy_out(rt, x, off, dst.data(), sz - off, nullptr), TM_OK);
        EXPECT_ST(tm_tensor_sync(rt, x), TM_OK);
        CHECK(memcmp(src.data() + off, dst.data(), sz - off) == 0,
              "nvme tail differs home %d size %llu", home, (unsigned long long)sz);
        CHECK(dst[sz - off] == 0xCD, "nvme copy_out overran");
        // copy_in into the NVMe-only tensor at the last byte.
        unsigned char last = 0x5A;
        EXPECT_ST(tm_tensor_copy_in(rt, x, sz - 1, &last, 1, nullptr), TM_OK);
        src[sz - 1] = last;
        EXPECT_ST(tm_tensor_read(rt, x, 0, dst.data(), sz), TM_OK);
        CHECK(memcmp(src.data(), dst.data(), sz) == 0,
              "after nvme copy_in last byte differs home %d size %llu", home,
              (unsigned long long)sz);
      }
      EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
    }
  }

  // "Device memory" on the emulated device: another tensor's HBM pointer as src and dst.
  {
    tm_tensor dev = make_t(rt, 65536, TM_TIER_HBM, "devbuf");
    tm_tensor host = make_t(rt, 65536, TM_TIER_DRAM, "dramT");
    void* p = nullptr;
    EXPECT_ST(tm_tensor_acquire(rt, dev, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK);
    std::vector<unsigned char> src(65536), dst(65536);
    fill(src, 7);
    memcpy(p, src.data(), 65536);
    EXPECT_ST(tm_tensor_copy_in(rt, host, 0, p, 65536, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, host), TM_OK);
    EXPECT_ST(tm_tensor_read(rt, host, 0, dst.data(), 65536), TM_OK);
    CHECK(memcmp(src.data(), dst.data(), 65536) == 0, "device->DRAM copy_in differs");
    memset(p, 0, 65536);
    EXPECT_ST(tm_tensor_copy_out(rt, host, 0, p, 65536, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, host), TM_OK);
    CHECK(memcmp(src.data(), p, 65536) == 0, "DRAM->device copy_out differs");
    // A range that starts inside device memory and runs past its tensor's copy.
    tm_status s = tm_tensor_copy_out(rt, host, 0, (char*)p + 65536 - 100, 100, nullptr);
    printf("info copy_out into last 100 bytes of an HBM copy -> %s\n", tm_status_string(s));
    tm_tensor_sync(rt, host);
    // copy_in of a tensor from its own pinned copy, overlapping ranges (dst = src + 1).
    tm_tensor self = make_t(rt, 65536, TM_TIER_DRAM, "self");
    EXPECT_ST(tm_tensor_copy_in(rt, self, 0, src.data(), 65536, nullptr), TM_OK);
    EXPECT_ST(tm_tensor_sync(rt, self), TM_OK);
    void* q = nullptr;
    EXPECT_ST(tm_tensor_acquire(rt, self, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &q), TM_OK);
    if (!getenv("SKIP_OVERLAP")) s = tm_tensor_copy_in(rt, self, 1, q, 4096, nullptr);
    printf("info copy_in(self, offset 1, src = own pinned DRAM copy) -> %s: %s\n",
           tm_status_string(s), s ? tm_last_error() : "");
    tm_tensor_sync(rt, self);
    if (!getenv("SKIP_OVERLAP")) s = tm_tensor_copy_out(rt, self, 0, (char*)q + 1, 4096, nullptr);
    printf("info copy_out(self, dst = own pinned DRAM copy + 1) -> %s: %s\n", tm_status_string(s),
           s ? tm_last_error() : "");
    tm_tensor_sync(rt, self);
    EXPECT_ST(tm_tensor_release(rt, self, TM_TIER_DRAM), TM_OK);
    // copy_in into a tensor pinned in another tier.
    void* r = nullptr;
    EXPECT_ST(tm_tensor_acquire(rt, self, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &r), TM_OK);
    EXPECT_ST(tm_tensor_copy_in(rt, self, 0, src.data(), 16, nullptr), TM_ERR_BUSY);
    EXPECT_ST(tm_tensor_release(rt, self, TM_TIER_HBM), TM_OK);
    // write-acquired in same tier: copy_in must be BUSY.
    EXPECT_ST(tm_tensor_acquire(rt, self, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr, &r), TM_OK);
    EXPECT_ST(tm_tensor_copy_in(rt, self, 0, src.data(), 16, nullptr), TM_ERR_BUSY);
    EXPECT_ST(tm_tensor_copy_out(rt, self, 0, dst.data(), 16, nullptr), TM_ERR_BUSY);
    EXPECT_ST(tm_tensor_release(rt, self, TM_TIER_DRAM), TM_OK);
    EXPECT_ST(tm_tensor_release(rt, dev, TM_TIER_HBM), TM_OK);
    EXPECT_ST(tm_tensor_destroy(rt, self), TM_OK);
    EXPECT_ST(tm_tensor_destroy(rt, dev), TM_OK);
    EXPECT_ST(tm_tensor_destroy(rt, host), TM_OK);
  }
  // copy_out then destroy at once; copy_in then destroy at once.
  for (int home = 0; home < 3; home++) {
    for (int i = 0; i < 50; i++) {
      tm_tensor x = make_t(rt, 100000, home);
      std::vector<unsigned char> src(100000), dst(100000);
      fill(src, i);
      EXPECT_ST(tm_tensor_copy_in(rt, x, 0, src.data(), 100000, nullptr), TM_OK);
      EXPECT_ST(tm_tensor_copy_out(rt, x, 0, dst.data(), 100000, nullptr), TM_OK);
      EXPECT_ST(tm_tensor_destroy(rt, x), TM_OK);
      // What is in dst now? docs: dst holds the bytes once tm_tensor_sync returns; sync needs the
      // handle, which is gone. runtime_sync then.
      EXPECT_ST(tm_runtime_sync(rt), TM_OK);
      if (memcmp(src.data(), dst.data(), 100000) != 0) {
        printf("info home %d: copy_out then destroy: dst incomplete after runtime_sync\n", home);
        break;
      }
    }
  }
  tm_stats st = TM_STATS_INIT;
  EXPECT_ST(tm_runtime_stats(rt, &st), TM_OK);
  CHECK(st.tensors == 1, "tensors alive %llu", (unsigned long long)st.tensors);
  CHECK(st.tiers[0].used <= 8192 && st.tiers[1].used <= 8192, "used hbm %llu dram %llu nvme %llu",
        (unsigned long long)st.tiers[0].used, (unsigned long long)st.tiers[1].used,
        (unsigned long long)st.tiers[2].used);
  EXPECT_ST(tm_tensor_destroy(rt, t), TM_OK);
  EXPECT_ST(tm_runtime_stats(rt, &st), TM_OK);
  CHECK(st.tiers[0].used == 0 && st.tiers[1].used == 0 && st.tiers[2].used == 0,
        "leak: used hbm %llu dram %llu nvme %llu", (unsigned long long)st.tiers[0].used,
        (unsigned long long)st.tiers[1].used, (unsigned long long)st.tiers[2].used);
  EXPECT_ST(tm_runtime_destroy(rt), TM_OK);
  rmdir(g_dir.c_str());
  return finish("copy_edges");
}
