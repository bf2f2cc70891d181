/* The public header compiled as C (C11), and a round trip through HBM, DRAM and NVMe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiermem/tiermem.h"

#define CHECK(call)                                                                             \
  do {                                                                                          \
    tm_status s_ = (call);                                                                      \
    if (s_ != TM_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, tm_status_string(s_), \
              tm_last_error());                                                                 \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "/var/tmp";
  tm_config cfg = TM_CONFIG_INIT;
  cfg.device = TM_DEVICE_EMULATED;
  cfg.hbm_bytes = 16u << 20;
  cfg.dram_bytes = 16u << 20;
  cfg.nvme_bytes = 32u << 20;
  cfg.nvme_paths = dir;
  tm_runtime rt;
  CHECK(tm_runtime_create(&cfg, &rt));

  tm_tensor_desc desc = TM_TENSOR_DESC_INIT;
  desc.bytes = 1000003; /* odd on purpose */
  desc.cls = TM_CLASS_OPTIMIZER_STATE;
  desc.name = "c-round-trip";
  tm_tensor t;
  CHECK(tm_tensor_create(rt, &desc, &t));

  unsigned char* data = malloc(desc.bytes);
  unsigned char* back = malloc(desc.bytes);
  if (data == NULL || back == NULL) return 1;
  for (size_t i = 0; i < desc.bytes; ++i) data[i] = (unsigned char)(i * 2654435761u >> 13);
  CHECK(tm_tensor_write(rt, t, 0, data, desc.bytes));
  CHECK(tm_tensor_offload(rt, t, TM_TIER_NVME));
  CHECK(tm_tensor_sync(rt, t));
  uint32_t mask = 0;
  CHECK(tm_tensor_residency(rt, t, &mask));
  /* On NVMe, nothing in HBM; DRAM may keep a clean copy (TIERMEM_DRAM_INCLUSIVE). */
  if ((mask & TM_TIER_BIT(TM_TIER_NVME)) == 0 || (mask & TM_TIER_BIT(TM_TIER_HBM)) != 0) {
    fprintf(stderr, "residency %u, expected NVMe (and perhaps a clean DRAM copy)\n", mask);
    return 1;
  }
  void* p = NULL;
  CHECK(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, NULL, &p));
  CHECK(tm_tensor_release(rt, t, TM_TIER_HBM));
  CHECK(tm_tensor_read(rt, t, 0, back, desc.bytes));
  if (memcmp(data, back, desc.bytes) != 0) {
    fprintf(stderr, "bytes differ after the round trip\n");
    return 1;
  }
  /* The copy that the caller's stream does not wait for, from C: back in from the buffer, then
   * asked without blocking until it is done. */
  CHECK(tm_tensor_copy_in_async(rt, t, 0, data, desc.bytes, NULL));
  int32_t done = 0;
  do {
    CHECK(tm_tensor_copy_done(rt, t, &done));
  } while (!done);
  CHECK(tm_tensor_read(rt, t, 0, back, desc.bytes));
  if (memcmp(data, back, desc.bytes) != 0) {
    fprintf(stderr, "bytes differ after tm_tensor_copy_in_async\n");
    return 1;
  }
  tm_stats stats = TM_STATS_INIT;
  CHECK(tm_runtime_stats(rt, &stats));
  if (stats.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME] != desc.bytes) return 1;

  /* A bad call gives a status and a message, from C too. */
  if (tm_tensor_offload(rt, t, TM_TIER_HBM) != TM_ERR_INVALID_ARGUMENT || tm_last_error()[0] == 0) {
    return 1;
  }
  CHECK(tm_tensor_destroy(rt, t));
  if (tm_tensor_destroy(rt, t) != TM_ERR_INVALID_HANDLE) return 1;
  CHECK(tm_runtime_destroy(rt));
  free(data);
  free(back);
  printf("c_api_test: round trip of %llu bytes OK (tiermem %s)\n", (unsigned long long)desc.bytes,
         tm_version_string());
  return 0;
}
