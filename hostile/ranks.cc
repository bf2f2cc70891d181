// Hostile probe: prints what a runtime resolved from the environment's rank variables and budgets.
#include "common.h"
int main(int argc, char** argv) {
  tm_config c = TM_CONFIG_INIT;
  c.device = TM_DEVICE_EMULATED;
  if (argc > 1) c.local_rank = atoi(argv[1]);
  if (argc > 2) c.local_world_size = atoi(argv[2]);
  tm_runtime rt = {0};
  tm_status s = tm_runtime_create(&c, &rt);
  if (s) {
    printf("create -> %s: %s\n", tm_status_string(s), tm_last_error());
    return 1;
  }
  tm_info i = TM_INFO_INIT;
  tm_runtime_info(rt, &i);
  char r[64], w[64], d[64], n[64], h[64];
  size_t need;
  tm_runtime_config_value(rt, "TIERMEM_LOCAL_RANK", r, 64, &need);
  tm_status sw = tm_runtime_config_value(rt, "TIERMEM_LOCAL_WORLD_SIZE", w, 64, &need);
  tm_runtime_config_value(rt, "TIERMEM_DRAM_BYTES", d, 64, &need);
  tm_runtime_config_value(rt, "TIERMEM_NVME_BYTES", n, 64, &need);
  tm_runtime_config_value(rt, "TIERMEM_HBM_BYTES", h, 64, &need);
  printf("rank %d/%d (cfg %s/%s%s) hbm %llu (%s) dram %llu (%s) nvme %llu (%s)\n", i.local_rank,
         i.local_world_size, r, sw ? "?" : w, sw ? tm_last_error() : "",
         (unsigned long long)i.tier_bytes[0], h, (unsigned long long)i.tier_bytes[1], d,
         (unsigned long long)i.tier_bytes[2], n);
  tm_runtime_destroy(rt);
  return 0;
}
