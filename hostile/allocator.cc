// Hostile probe: tm_config.device_alloc/device_free that fail sometimes, return misaligned or
// duplicate pointers, one without the other; every alloc must be freed once with its size.
#include <map>
#include <mutex>

#include "common.h"
struct Ledger {
  std::mutex mu;
  std::map<void*, size_t> live;
  int allocs = 0, frees = 0, bad_frees = 0, size_mismatch = 0, fail_every = 0, calls = 0;
  int misalign = 0;
  bool dup = false;
  void* dup_ptr = nullptr;
  void* user_seen = nullptr;
  bool wrong_user = false;
  int wrong_device = 0;
  uint64_t outstanding = 0, peak = 0;
};
static void* my_alloc(void* user, size_t bytes, int32_t device, void* stream) {
  Ledger* l = (Ledger*)user;
  std::lock_guard<std::mutex> g(l->mu);
  if (device != -1) l->wrong_device++;
  l->calls++;
  if (l->fail_every && l->calls % l->fail_every == 0) return nullptr;
  void* p;
  if (l->dup && l->dup_ptr) {
    p = l->dup_ptr;
  } else {
    p = malloc(bytes + 64);
    if (l->misalign) p = (char*)p + l->misalign;
    if (l->dup) l->dup_ptr = p;
  }
  if (l->live.count(p) && !l->dup) printf("FAIL alloc returned a live pointer?\n");
  l->live[p] = bytes;
  l->allocs++;
  l->outstanding += bytes;
  if (l->outstanding > l->peak) l->peak = l->outstanding;
  return p;
}
static void my_free(void* user, void* ptr, size_t bytes, int32_t device, void* stream) {
  Ledger* l = (Ledger*)user;
  std::lock_guard<std::mutex> g(l->mu);
  l->frees++;
  auto it = l->live.find(ptr);
  if (it == l->live.end()) {
    l->bad_frees++;
    return;
  }
  if (it->second != bytes) l->size_mismatch++;
  l->outstanding -= it->second;
  l->live.erase(it);
  if (!l->dup) free((char*)ptr - l->misalign);
}
static void run(const char* label, Ledger& l, uint64_t hbm, int n, int sz) {
  tm_config c = TM_CONFIG_INIT;
  c.device_alloc = my_alloc;
  c.device_free = my_free;
  c.device_allocator_user = &l;
  tm_runtime rt = make_rt(hbm, 8 << 20, 64 << 20, &c);
  if (!rt.bits) {
    g_fail++;
    return;
  }
  tm_info info = TM_INFO_INIT;
  tm_runtime_info(rt, &info);
  CHECK(info.device_allocator == 1, "%s: device_allocator %d", label, info.device_allocator);
  std::vector<tm_tensor> ts;
  int ooms = 0;
  std::vector<unsigned char> src(sz), dst(sz);
  for (int i = 0; i < n; i++) {
    tm_tensor t = make_t(rt, sz, TM_TIER_HBM);
    ts.push_back(t);
    fill(src, i);
    tm_status s = tm_tensor_write(rt, t, 0, src.data(), sz);
    if (s == TM_ERR_OUT_OF_MEMORY) {
      ooms++;
      if (ooms == 1) printf("  %s: write OOM: %s\n", label, tm_last_error());
      continue;
    }
    CHECK(s == TM_OK, "%s write %d -> %s %s", label, i, tm_status_string(s), tm_last_error());
    void* p;
    s = tm_tensor_acquire(rt, ts[i / 2], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p);
    if (s == TM_OK)
      tm_tensor_release(rt, ts[i / 2], TM_TIER_HBM);
    else if (s != TM_ERR_OUT_OF_MEMORY)
      CHECK(false, "%s acquire -> %s %s", label, tm_status_string(s), tm_last_error());
    else
      ooms++;
    if (i % 3 == 0) tm_tensor_prefetch(rt, ts[i / 3], TM_TIER_HBM);
    if (i % 5 == 0) tm_tensor_offload(rt, ts[i / 5], TM_TIER_DRAM);
    if (i % 7 == 0) {
      tm_tensor_copy_out(rt, ts[i / 7], 0, dst.data(), sz, nullptr);
      tm_tensor_sync(rt, ts[i / 7]);
    }
  }
  tm_status s = tm_runtime_sync(rt);
  if (s) printf("  %s: runtime_sync -> %s %s\n", label, tm_status_string(s), tm_last_error());
  // Verify data of every tensor whose write succeeded.
  for (int i = 0; i < n; i++) {
    fill(src, i);
    uint32_t m = 0;
    tm_tensor_residency(rt, ts[i], &m);
    if (!m) continue;
    s = tm_tensor_read(rt, ts[i], 0, dst.data(), sz);
    if (!l.dup)
      CHECK(s == TM_OK && memcmp(src.data(), dst.data(), sz) == 0, "%s tensor %d data (%s)", label,
            i, tm_status_string(s));
  }
  tm_stats st = TM_STATS_INIT;
  tm_runtime_stats(rt, &st);
  {
    std::lock_guard<std::mutex> g(l.mu);
    CHECK(st.tiers[0].used == l.outstanding,
          "%s: stats hbm used %llu, outstanding via device_alloc %llu", label,
          (unsigned long long)st.tiers[0].used, (unsigned long long)l.outstanding);
    CHECK(l.peak <= hbm, "%s: peak outstanding %llu > budget %llu", label,
          (unsigned long long)l.peak, (unsigned long long)hbm);
  }
  for (auto t : ts) tm_tensor_destroy(rt, t);
  tm_runtime_sync(rt);
  tm_runtime_stats(rt, &st);
  {
    std::lock_guard<std::mutex> g(l.mu);
    printf("  %s: after destroying every tensor: stats used %llu, outstanding %llu (%zu blocks)\n",
           label, (unsigned long long)st.tiers[0].used, (unsigned long long)l.outstanding,
           l.live.size());
  }
  EXPECT_ST(tm_runtime_destroy(rt), TM_OK);
  CHECK(l.live.empty() && l.bad_frees == 0 && l.size_mismatch == 0 && l.wrong_device == 0,
        "%s: allocs %d frees %d live %zu bad_frees %d size_mismatch %d wrong_device %d", label,
        l.allocs, l.frees, l.live.size(), l.bad_frees, l.size_mismatch, l.wrong_device);
  printf("  %s: allocs %d frees %d ooms %d\n", label, l.allocs, l.frees, ooms);
}
int main() {
  {
    Ledger l;
    run("plain", l, 1 << 20, 40, 100000);
  }
  {
    Ledger l;
    l.fail_every = 3;
    run("fail1of3", l, 1 << 20, 40, 100000);
  }
  {
    Ledger l;
    l.fail_every = 1;
    run("failall", l, 1 << 20, 10, 100000);
  }
  {
    Ledger l;
    l.misalign = 1;
    run("misaligned", l, 1 << 20, 20, 100000);
  }
  {
    Ledger l;
    l.dup = true;
    run("duplicate", l, 1 << 20, 6, 1000);
  }
  // Budgets at uint64 edges.
  {
    Ledger l;
    tm_config c = TM_CONFIG_INIT;
    c.device_alloc = my_alloc;
    c.device_free = my_free;
    c.device_allocator_user = &l;
    c.device = TM_DEVICE_EMULATED;
    c.nvme_paths = "/var/tmp";
    c.nvme_bytes = 64 << 20;
    c.dram_bytes = 8 << 20;
    for (uint64_t hbm : {UINT64_MAX, UINT64_MAX - 255, (uint64_t)1 << 63, (uint64_t)1,
                         (uint64_t)255, (uint64_t)256}) {
      c.hbm_bytes = hbm;
      tm_runtime rt = {0};
      tm_status s = tm_runtime_create(&c, &rt);
      printf("  hbm_bytes=%llu with device_alloc -> %s %s\n", (unsigned long long)hbm,
             tm_status_string(s), s ? tm_last_error() : "");
      if (s == TM_OK) {
        tm_info info = TM_INFO_INIT;
        tm_runtime_info(rt, &info);
        char buf[64];
        size_t need = 0;
        tm_runtime_config_value(rt, "TIERMEM_HBM_BYTES", buf, sizeof buf, &need);
        printf("    tier_bytes[hbm]=%llu config_value=%s\n", (unsigned long long)info.tier_bytes[0],
               buf);
        tm_tensor t = make_t(rt, 1 << 20, TM_TIER_HBM);
        void* p;
        s = tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p);
        printf("    acquire 1MiB in HBM -> %s %s\n", tm_status_string(s), s ? tm_last_error() : "");
        if (!s) tm_tensor_release(rt, t, TM_TIER_HBM);
        tm_tensor big = make_t(rt, UINT64_MAX - 4096, TM_TIER_HBM);
        if (big.bits) {
          s = tm_tensor_acquire(rt, big, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p);
          printf("    acquire 2^64-4097 bytes in HBM -> %s %s\n", tm_status_string(s),
                 s ? tm_last_error() : "");
          if (!s) tm_tensor_release(rt, big, TM_TIER_HBM);
        }
        tm_runtime_destroy(rt);
      }
    }
    CHECK(l.live.empty() && l.bad_frees == 0, "edges: live %zu bad_frees %d", l.live.size(),
          l.bad_frees);
  }
  // One without the other.
  {
    tm_config c = TM_CONFIG_INIT;
    c.device = TM_DEVICE_EMULATED;
    c.device_alloc = my_alloc;
    tm_runtime rt = {0};
    EXPECT_ST(tm_runtime_create(&c, &rt), TM_ERR_CONFIG);
    c.device_alloc = nullptr;
    c.device_free = my_free;
    EXPECT_ST(tm_runtime_create(&c, &rt), TM_ERR_CONFIG);
    // user set, callbacks not: fine?
    c.device_free = nullptr;
    c.device_allocator_user = (void*)0x1234;
    tm_status s = tm_runtime_create(&c, &rt);
    printf("  only device_allocator_user set -> %s %s\n", tm_status_string(s),
           s ? tm_last_error() : "");
    if (!s) tm_runtime_destroy(rt);
  }
  return finish("allocator");
}
