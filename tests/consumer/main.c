/* A user's program: create a runtime, push a tensor to NVMe and back, check it. */
#include <stdio.h>
#include <string.h>
#include <tiermem/tiermem.h>

int main(int argc, char** argv) {
  tm_config cfg = TM_CONFIG_INIT;
  cfg.device = TM_DEVICE_EMULATED;
  cfg.hbm_bytes = 8u << 20;
  cfg.dram_bytes = 8u << 20;
  cfg.nvme_bytes = 8u << 20;
  cfg.nvme_paths = argc > 1 ? argv[1] : "/var/tmp";
  tm_runtime rt;
  tm_tensor t;
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 5000;
  char in[5000], out[5000];
  memset(in, 'x', sizeof in);
  if (tm_runtime_create(&cfg, &rt) != TM_OK || tm_tensor_create(rt, &d, &t) != TM_OK ||
      tm_tensor_write(rt, t, 0, in, sizeof in) != TM_OK ||
      tm_tensor_offload(rt, t, TM_TIER_NVME) != TM_OK || tm_tensor_sync(rt, t) != TM_OK ||
      tm_tensor_read(rt, t, 0, out, sizeof out) != TM_OK || memcmp(in, out, sizeof in) != 0) {
    fprintf(stderr, "consumer: %s\n", tm_last_error());
    return 1;
  }
  tm_runtime_destroy(rt);
  printf("consumer: linked against tiermem %s, round trip OK\n", tm_version_string());
  return 0;
}
