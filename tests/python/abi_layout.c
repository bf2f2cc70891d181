/* abi_layout.c: prints the size of each public struct and the offset of each field as JSON, so
 * that tests/python/test_abi.py can check the ctypes mirror field by field. */
#include <stddef.h>
#include <stdio.h>
#include <tiermem/tiermem.h>

static int first;
#define BEGIN(type)                                                               \
  printf("%s\"%s\": {\"__size__\": %zu", first ? "" : ", ", #type, sizeof(type)); \
  first = 0
#define FIELD(type, field) printf(", \"%s\": %zu", #field, offsetof(type, field))
#define END() printf("}")

int main(void) {
  first = 1;
  printf("{");
  BEGIN(tm_config);
  FIELD(tm_config, struct_size);
  FIELD(tm_config, api_version);
  FIELD(tm_config, device);
  FIELD(tm_config, cuda_device);
  FIELD(tm_config, hbm_bytes);
  FIELD(tm_config, dram_bytes);
  FIELD(tm_config, nvme_paths);
  FIELD(tm_config, nvme_bytes);
  FIELD(tm_config, io_engine);
  FIELD(tm_config, io_block_size);
  FIELD(tm_config, io_queue_depth);
  FIELD(tm_config, numa_node);
  FIELD(tm_config, log_level);
  FIELD(tm_config, emu_link_gbps);
  FIELD(tm_config, io_threads);
  FIELD(tm_config, prefetch_depth);
  FIELD(tm_config, prefetch_bytes);
  FIELD(tm_config, placement);
  FIELD(tm_config, trace);
  FIELD(tm_config, checksum);
  FIELD(tm_config, device_alloc);
  FIELD(tm_config, device_free);
  FIELD(tm_config, device_allocator_user);
  FIELD(tm_config, local_rank);
  FIELD(tm_config, local_world_size);
  END();
  BEGIN(tm_tensor_desc);
  FIELD(tm_tensor_desc, struct_size);
  FIELD(tm_tensor_desc, bytes);
  FIELD(tm_tensor_desc, cls);
  FIELD(tm_tensor_desc, home_tier);
  FIELD(tm_tensor_desc, name);
  END();
  BEGIN(tm_stats);
  FIELD(tm_stats, struct_size);
  FIELD(tm_stats, tiers);
  FIELD(tm_stats, bytes_moved);
  FIELD(tm_stats, tensors);
  FIELD(tm_stats, acquires);
  FIELD(tm_stats, acquire_hits);
  FIELD(tm_stats, acquire_misses);
  FIELD(tm_stats, acquire_stall_ns);
  FIELD(tm_stats, prefetches);
  FIELD(tm_stats, evictions);
  FIELD(tm_stats, eviction_bytes);
  FIELD(tm_stats, schedule_length);
  FIELD(tm_stats, schedule_relearned);
  FIELD(tm_stats, prefetches_dropped);
  FIELD(tm_stats, prefetches_dropped_no_room);
  FIELD(tm_stats, prefetches_dropped_demand);
  FIELD(tm_stats, prefetches_dropped_superseded);
  FIELD(tm_stats, prefetches_cancelled);
  FIELD(tm_stats, moves_failed);
  FIELD(tm_stats, demand_waits);
  FIELD(tm_stats, demand_wait_ns);
  FIELD(tm_stats, fragmentation_evictions);
  FIELD(tm_stats, write_throughs);
  FIELD(tm_stats, write_through_bytes);
  FIELD(tm_stats, clean_reads);
  FIELD(tm_stats, clean_read_bytes);
  FIELD(tm_stats, clean_drops);
  FIELD(tm_stats, clean_drop_bytes);
  FIELD(tm_stats, recompute_drops);
  FIELD(tm_stats, recompute_drop_bytes);
  FIELD(tm_stats, recomputes);
  FIELD(tm_stats, recompute_failures);
  FIELD(tm_stats, recompute_ns);
  FIELD(tm_stats, relocations);
  FIELD(tm_stats, relocation_bytes);
  FIELD(tm_stats, copied_in_bytes);
  FIELD(tm_stats, copied_out_bytes);
  FIELD(tm_stats, offloads_parked);
  FIELD(tm_stats, hbm_handed_on);
  FIELD(tm_stats, hbm_handed_on_bytes);
  FIELD(tm_stats, moves_behind);
  FIELD(tm_stats, moves_behind_bytes);
  FIELD(tm_stats, moves_failed_lost);
  END();
  BEGIN(tm_info);
  FIELD(tm_info, struct_size);
  FIELD(tm_info, device);
  FIELD(tm_info, cuda_device);
  FIELD(tm_info, hbm_device_pointers);
  FIELD(tm_info, io_engine);
  FIELD(tm_info, numa_node);
  FIELD(tm_info, tier_bytes);
  FIELD(tm_info, io_block_size);
  FIELD(tm_info, io_queue_depth);
  FIELD(tm_info, io_threads);
  FIELD(tm_info, nvme_paths);
  FIELD(tm_info, nvme_alignment);
  FIELD(tm_info, prefetch_depth);
  FIELD(tm_info, prefetch_bytes);
  FIELD(tm_info, placement);
  FIELD(tm_info, device_name);
  FIELD(tm_info, local_rank);
  FIELD(tm_info, local_world_size);
  FIELD(tm_info, device_allocator);
  END();
  /* The CPU Adam's (python/tiermem/_optim_capi.py). */
  BEGIN(tm_adam_config);
  FIELD(tm_adam_config, struct_size);
  FIELD(tm_adam_config, lr);
  FIELD(tm_adam_config, beta1);
  FIELD(tm_adam_config, beta2);
  FIELD(tm_adam_config, eps);
  FIELD(tm_adam_config, weight_decay);
  FIELD(tm_adam_config, adamw);
  FIELD(tm_adam_config, amsgrad);
  FIELD(tm_adam_config, threads);
  FIELD(tm_adam_config, numa_node);
  END();
  BEGIN(tm_adam_span);
  FIELD(tm_adam_span, param);
  FIELD(tm_adam_span, exp_avg);
  FIELD(tm_adam_span, exp_avg_sq);
  FIELD(tm_adam_span, max_exp_avg_sq);
  FIELD(tm_adam_span, grad);
  FIELD(tm_adam_span, grad_dtype);
  FIELD(tm_adam_span, param_out);
  FIELD(tm_adam_span, param_out_dtype);
  FIELD(tm_adam_span, count);
  END();
  BEGIN(tm_adam_bucket);
  FIELD(tm_adam_bucket, state);
  FIELD(tm_adam_bucket, count);
  FIELD(tm_adam_bucket, grad);
  FIELD(tm_adam_bucket, grad_dtype);
  FIELD(tm_adam_bucket, param_out);
  FIELD(tm_adam_bucket, param_out_dtype);
  END();
  BEGIN(tm_adam_group);
  FIELD(tm_adam_group, config);
  FIELD(tm_adam_group, step);
  FIELD(tm_adam_group, buckets);
  FIELD(tm_adam_group, count);
  END();
  printf("}\n");
  return 0;
}
