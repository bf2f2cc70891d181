// Hostile probes: shared helpers (a runtime with small budgets, check macros that report, not
// abort).
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tiermem/tiermem.h"

static int g_fail = 0;
#define EXPECT_ST(call, want)                                                      \
  do {                                                                             \
    tm_status s_ = (call);                                                         \
    if (s_ != (want)) {                                                            \
      g_fail++;                                                                    \
      printf("FAIL %s:%d %s -> %s (want %s): %s\n", __FILE__, __LINE__, #call,     \
             tm_status_string(s_), tm_status_string(want), tm_last_error());       \
    } else if (s_ != TM_OK) {                                                      \
      printf("ok   %s -> %s: %s\n", #call, tm_status_string(s_), tm_last_error()); \
    }                                                                              \
  } while (0)
#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      g_fail++;                                             \
      printf("FAIL %s:%d %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                  \
      printf("\n");                                         \
    }                                                       \
  } while (0)

static std::string g_dir;
static tm_runtime make_rt(uint64_t hbm, uint64_t dram, uint64_t nvme, tm_config* extra = nullptr) {
  if (g_dir.empty()) {
    char t[] = "/var/tmp/hostile-XXXXXX";
    g_dir = mkdtemp(t);
  }
  tm_config c = TM_CONFIG_INIT;
  if (extra) c = *extra;
  c.device = TM_DEVICE_EMULATED;
  if (hbm) c.hbm_bytes = hbm;
  if (dram) c.dram_bytes = dram;
  if (nvme) c.nvme_bytes = nvme;
  c.nvme_paths = g_dir.c_str();
  tm_runtime rt = {0};
  tm_status s = tm_runtime_create(&c, &rt);
  if (s != TM_OK) {
    printf("runtime_create -> %s: %s\n", tm_status_string(s), tm_last_error());
  }
  return rt;
}
static tm_tensor make_t(tm_runtime rt, uint64_t bytes, int home = TM_TIER_BY_PLACEMENT,
                        const char* name = nullptr) {
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = bytes;
  d.home_tier = home;
  d.name = name;
  tm_tensor t = {0};
  tm_status s = tm_tensor_create(rt, &d, &t);
  if (s != TM_OK)
    printf("tensor_create(%llu) -> %s: %s\n", (unsigned long long)bytes, tm_status_string(s),
           tm_last_error());
  return t;
}
static void fill(std::vector<unsigned char>& v, unsigned seed) {
  for (size_t i = 0; i < v.size(); i++)
    v[i] = (unsigned char)((i * 131 + seed * 7 + (i >> 8)) & 0xff);
}
static int finish(const char* name) {
  printf("%s: %d failures\n", name, g_fail);
  return g_fail ? 1 : 0;
}
