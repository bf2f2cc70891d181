/* tiermem.h: the stable C API of tiermem, a three-tier (HBM, pinned DRAM, NVMe) tensor memory.
 *
 * Conventions
 *  - Every function returns a tm_status (TM_OK == 0), except tm_status_string, tm_last_error and
 *    tm_version_string, which return strings that live for the whole process.
 *  - On failure, tm_last_error() gives a thread-local message naming what was wrong (the tensor,
 *    the file, the errno, the variable). It is only meaningful right after a failed call.
 *  - Handles are opaque values. A zero, destroyed or stale handle is detected and answered with
 *    TM_ERR_INVALID_HANDLE; it is never dereferenced.
 *  - Structs passed in carry their own size in their first field and are filled by an _INIT
 *    macro, so that callers compiled against an older header keep working.
 *  - No exception, abort or exit crosses this boundary on bad input.
 *  - All functions may be called from several threads at once.
 */
#ifndef TIERMEM_TIERMEM_H_
#define TIERMEM_TIERMEM_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define TM_API
#else
#define TM_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Version of the headers this code was compiled against. */
#define TM_VERSION_MAJOR 0
#define TM_VERSION_MINOR 1
#define TM_VERSION_PATCH 0
/** A single comparable number: major * 10000 + minor * 100 + patch. */
#define TM_VERSION (TM_VERSION_MAJOR * 10000 + TM_VERSION_MINOR * 100 + TM_VERSION_PATCH)

/*
 * Every enum ends with _MIN_ENUM and _MAX_ENUM (INT32_MIN and INT32_MAX): they fix the enum's
 * size at 32 bits for the ABI and make any int32 a valid value in C++ too, so that an out-of-range
 * value from a caller is rejected with TM_ERR_INVALID_ARGUMENT instead of being undefined
 * behaviour.
 */

/** Result of every call. New codes are only ever added before TM_STATUS_COUNT. */
typedef enum tm_status {
  TM_OK = 0,
  TM_ERR_INVALID_ARGUMENT = 1, /**< a NULL pointer, an out-of-range value, a bad struct_size */
  TM_ERR_INVALID_HANDLE = 2,   /**< a zero, destroyed or stale runtime or tensor handle */
  TM_ERR_OUT_OF_MEMORY = 3,    /**< HBM or DRAM budget too small; host memory or threads ran out */
  TM_ERR_NO_SPACE = 4,         /**< the NVMe tier or its file system is full */
  TM_ERR_IO = 5,               /**< a read or write on a swap file failed (errno in the message) */
  TM_ERR_DEVICE = 6,           /**< the device backend failed or is unavailable (CUDA error) */
  TM_ERR_CONFIG = 7,           /**< a configuration value or TIERMEM_* variable is invalid */
  TM_ERR_BUSY = 8,             /**< the tensor is pinned by an acquire and cannot be moved */
  TM_ERR_UNSUPPORTED = 9,      /**< the operation is not possible on this machine or tier */
  TM_ERR_INTERNAL = 10,        /**< a bug in tiermem: please report the message */
  TM_ERR_CORRUPT = 11, /**< NVMe data failed its checksum (tensor, file, offset in the message) */
  TM_STATUS_COUNT,
  TM_STATUS_MIN_ENUM = -0x7fffffff - 1,
  TM_STATUS_MAX_ENUM = 0x7fffffff
} tm_status;

/** The three tiers, fastest first. */
typedef enum tm_tier {
  TM_TIER_HBM = 0,  /**< device memory (or the emulated device) */
  TM_TIER_DRAM = 1, /**< pinned host memory, NUMA-local to the device */
  TM_TIER_NVME = 2, /**< swap files on NVMe (or any file system) */
  TM_TIER_COUNT,
  /** In a tm_tensor_desc: let the placement policy choose the home tier. */
  TM_TIER_BY_PLACEMENT = -1,
  TM_TIER_MIN_ENUM = -0x7fffffff - 1,
  TM_TIER_MAX_ENUM = 0x7fffffff
} tm_tier;

/** Bit of a tier in a residency mask. */
#define TM_TIER_BIT(tier) (1u << (unsigned)(tier))

/** What a tensor holds; drives placement. */
typedef enum tm_tensor_class {
  TM_CLASS_OTHER = 0,
  TM_CLASS_PARAM = 1,
  TM_CLASS_GRAD = 2,
  TM_CLASS_OPTIMIZER_STATE = 3,
  TM_CLASS_ACTIVATION = 4,
  TM_CLASS_COUNT,
  TM_CLASS_MIN_ENUM = -0x7fffffff - 1,
  TM_CLASS_MAX_ENUM = 0x7fffffff
} tm_tensor_class;

/** How an acquire will use the memory it returns. */
typedef enum tm_access {
  TM_ACCESS_READ = 0,       /**< contents are brought in; other copies stay valid */
  TM_ACCESS_WRITE = 1,      /**< contents will be overwritten whole: nothing is brought in */
  TM_ACCESS_READ_WRITE = 2, /**< contents are brought in and modified */
  TM_ACCESS_COUNT,
  TM_ACCESS_MIN_ENUM = -0x7fffffff - 1,
  TM_ACCESS_MAX_ENUM = 0x7fffffff
} tm_access;

/** Device backend selection. */
typedef enum tm_device_kind {
  TM_DEVICE_DEFAULT = 0,  /**< from TIERMEM_DEVICE, else auto */
  TM_DEVICE_AUTO = 1,     /**< CUDA when a device is present, else emulated (with a log line) */
  TM_DEVICE_CUDA = 2,     /**< a real CUDA device; fails when there is none */
  TM_DEVICE_EMULATED = 3, /**< host memory with its own budget and an emulated copy engine */
  TM_DEVICE_KIND_COUNT,
  TM_DEVICE_KIND_MIN_ENUM = -0x7fffffff - 1,
  TM_DEVICE_KIND_MAX_ENUM = 0x7fffffff
} tm_device_kind;

/** I/O engine selection for the NVMe tier. */
typedef enum tm_io_engine {
  TM_IO_ENGINE_DEFAULT = 0, /**< from TIERMEM_IO_ENGINE, else auto */
  TM_IO_ENGINE_AUTO = 1,    /**< io_uring, falling back to POSIX (with a log line) */
  TM_IO_ENGINE_URING = 2,   /**< io_uring; fails when it cannot be set up */
  TM_IO_ENGINE_POSIX = 3,   /**< pread/pwrite */
  TM_IO_ENGINE_COUNT,
  TM_IO_ENGINE_MIN_ENUM = -0x7fffffff - 1,
  TM_IO_ENGINE_MAX_ENUM = 0x7fffffff
} tm_io_engine;

/** Log verbosity. */
typedef enum tm_log_level {
  TM_LOG_DEFAULT = 0, /**< from TIERMEM_LOG_LEVEL, else warn */
  TM_LOG_ERROR = 1,
  TM_LOG_WARN = 2,
  TM_LOG_INFO = 3,
  TM_LOG_DEBUG = 4,
  TM_LOG_LEVEL_COUNT,
  TM_LOG_LEVEL_MIN_ENUM = -0x7fffffff - 1,
  TM_LOG_LEVEL_MAX_ENUM = 0x7fffffff
} tm_log_level;

/** Home tiers by tensor class (TIERMEM_PLACEMENT). */
typedef enum tm_placement {
  TM_PLACEMENT_DEFAULT = 0,       /**< from TIERMEM_PLACEMENT, else none */
  TM_PLACEMENT_NONE = 1,          /**< every class at home in HBM */
  TM_PLACEMENT_ZERO_OFFLOAD = 2,  /**< optimizer state at home in DRAM (ZeRO-Offload) */
  TM_PLACEMENT_ZERO_INFINITY = 3, /**< parameters and optimizer state on NVMe (ZeRO-Infinity) */
  TM_PLACEMENT_ACTIVATIONS = 4,   /**< activations in DRAM, spilled to NVMe */
  TM_PLACEMENT_COUNT,
  TM_PLACEMENT_MIN_ENUM = -0x7fffffff - 1,
  TM_PLACEMENT_MAX_ENUM = 0x7fffffff
} tm_placement;

/** Integrity of the NVMe tier (TIERMEM_CHECKSUM). */
typedef enum tm_checksum {
  TM_CHECKSUM_DEFAULT = 0, /**< from TIERMEM_CHECKSUM, else off */
  TM_CHECKSUM_OFF = 1,     /**< NVMe data is trusted as read */
  TM_CHECKSUM_XXH3 = 2,    /**< an XXH3-64 per block written, checked on every read */
  TM_CHECKSUM_COUNT,
  TM_CHECKSUM_MIN_ENUM = -0x7fffffff - 1,
  TM_CHECKSUM_MAX_ENUM = 0x7fffffff
} tm_checksum;

/** In tm_config.prefetch_depth: take TIERMEM_PREFETCH_DEPTH, else 4. */
#define TM_PREFETCH_DEPTH_DEFAULT (-1)

/** In tm_config.cuda_device: take TIERMEM_CUDA_DEVICE, else the local rank mod the devices seen. */
#define TM_CUDA_DEVICE_DEFAULT (-1)
/** In tm_config.numa_node: take TIERMEM_NUMA, else auto. */
#define TM_NUMA_DEFAULT (-1)
/** In tm_config.numa_node: the GPU's node with CUDA, else the calling thread's node. */
#define TM_NUMA_AUTO (-2)
/** In tm_config.numa_node: do not bind host memory. */
#define TM_NUMA_OFF (-3)

/**
 * Runtime configuration. Fill with TM_CONFIG_INIT, then set what you want: every field left at
 * its _INIT value comes from the TIERMEM_* environment variable of the same name, then from the
 * documented default (docs/environment.md).
 */
typedef struct tm_config {
  size_t struct_size;      /**< sizeof(tm_config), set by TM_CONFIG_INIT */
  uint32_t api_version;    /**< TM_VERSION, set by TM_CONFIG_INIT */
  tm_device_kind device;   /**< TIERMEM_DEVICE */
  int32_t cuda_device;     /**< TIERMEM_CUDA_DEVICE; TM_CUDA_DEVICE_DEFAULT to leave unset */
  uint64_t hbm_bytes;      /**< TIERMEM_HBM_BYTES: the HBM tier's budget */
  uint64_t dram_bytes;     /**< TIERMEM_DRAM_BYTES: the pinned DRAM tier's budget */
  const char* nvme_paths;  /**< TIERMEM_NVME_PATHS: colon-separated directories for swap files */
  uint64_t nvme_bytes;     /**< TIERMEM_NVME_BYTES: the NVMe tier's budget, over all paths */
  tm_io_engine io_engine;  /**< TIERMEM_IO_ENGINE */
  uint32_t io_block_size;  /**< TIERMEM_IO_BLOCK_SIZE: bytes per I/O request */
  uint32_t io_queue_depth; /**< TIERMEM_IO_QUEUE_DEPTH: requests in flight per ring */
  int32_t numa_node;       /**< TIERMEM_NUMA; TM_NUMA_DEFAULT to leave unset */
  tm_log_level log_level;  /**< TIERMEM_LOG_LEVEL */
  double emu_link_gbps;    /**< TIERMEM_EMU_LINK_GBPS: emulated link cap in GB/s; 0 = none */
  /* Fields below were added after 0.1.0's first cut; callers built before see a smaller
     struct_size and keep working. New fields are only ever appended. */
  uint32_t io_threads;     /**< TIERMEM_IO_THREADS: I/O threads (io_uring rings) */
  int32_t prefetch_depth;  /**< TIERMEM_PREFETCH_DEPTH; TM_PREFETCH_DEPTH_DEFAULT to leave unset */
  uint64_t prefetch_bytes; /**< TIERMEM_PREFETCH_BYTES: bound on prefetch bytes in flight */
  tm_placement placement;  /**< TIERMEM_PLACEMENT */
  const char*
      trace; /**< TIERMEM_TRACE: Chrome-trace JSON file, opened at create, written at destroy */
  tm_checksum checksum; /**< TIERMEM_CHECKSUM: verify NVMe data on every read */
  /* Appended in 0.3: the framework's device allocator, ranks on a node. */
  /**
   * Optional: the framework's device allocator (a caching allocator such as PyTorch's or RMM's).
   * When device_alloc is set, the HBM tier asks it for each copy instead of reserving a slab up
   * front, and hands the memory back with device_free when the copy is evicted or its tensor is
   * destroyed. TIERMEM_HBM_BYTES stays tiermem's budget. stream is NULL in this
   * version (no caller's stream is known where space is reserved: the memory must be usable on
   * any stream); device is the CUDA ordinal (-1: emulated device).
   * device_alloc returns NULL when it cannot allocate. Both may be called from tiermem's
   * threads as well as the caller's, and must not call back into tiermem. Both or neither.
   */
  void* (*device_alloc)(void* user, size_t bytes, int32_t device, void* stream);
  void (*device_free)(void* user, void* ptr, size_t bytes, int32_t device, void* stream);
  void* device_allocator_user; /**< passed to device_alloc and device_free as user */
  int32_t local_rank;          /**< TIERMEM_LOCAL_RANK; TM_LOCAL_RANK_DEFAULT to leave unset */
  int32_t local_world_size; /**< TIERMEM_LOCAL_WORLD_SIZE; TM_LOCAL_RANK_DEFAULT to leave unset */
} tm_config;

/** In tm_config.local_rank / local_world_size: from the environment (see docs/environment.md:
    TIERMEM_LOCAL_RANK, then torchrun's LOCAL_RANK, then Open MPI's, then Slurm's). */
#define TM_LOCAL_RANK_DEFAULT (-1)

#define TM_CONFIG_INIT                                                                             \
  {                                                                                                \
    sizeof(tm_config), TM_VERSION, TM_DEVICE_DEFAULT, TM_CUDA_DEVICE_DEFAULT, 0, 0, NULL, 0,       \
        TM_IO_ENGINE_DEFAULT, 0, 0, TM_NUMA_DEFAULT, TM_LOG_DEFAULT, 0.0, 0,                       \
        TM_PREFETCH_DEPTH_DEFAULT, 0, TM_PLACEMENT_DEFAULT, NULL, TM_CHECKSUM_DEFAULT, NULL, NULL, \
        NULL, TM_LOCAL_RANK_DEFAULT, TM_LOCAL_RANK_DEFAULT                                         \
  }

/** Describes a tensor to create. Fill with TM_TENSOR_DESC_INIT. */
typedef struct tm_tensor_desc {
  size_t struct_size;  /**< sizeof(tm_tensor_desc), set by TM_TENSOR_DESC_INIT */
  uint64_t bytes;      /**< size in bytes, at least 1 */
  tm_tensor_class cls; /**< what it holds */
  int32_t home_tier;   /**< a tm_tier, or TM_TIER_BY_PLACEMENT */
  const char* name;    /**< optional, copied; used in messages and traces */
} tm_tensor_desc;

#define TM_TENSOR_DESC_INIT \
  { sizeof(tm_tensor_desc), 0, TM_CLASS_OTHER, TM_TIER_BY_PLACEMENT, NULL }

/** Counters of one tier. */
typedef struct tm_tier_stats {
  uint64_t capacity; /**< budget in bytes */
  uint64_t used;     /**< bytes allocated now (rounded up to the tier's granule) */
  uint64_t peak;     /**< largest value of used so far */
} tm_tier_stats;

/** Runtime counters. Set struct_size (or use TM_STATS_INIT) before calling tm_runtime_stats. */
typedef struct tm_stats {
  size_t struct_size;
  tm_tier_stats tiers[TM_TIER_COUNT];
  /** bytes_moved[from][to]: tensor bytes copied between tiers (HBM<->DRAM, DRAM<->NVMe). */
  uint64_t bytes_moved[TM_TIER_COUNT][TM_TIER_COUNT];
  uint64_t tensors; /**< tensors alive */
  /* Appended fields; a caller with a smaller struct_size gets only what it has room for. */
  uint64_t acquires;         /**< successful acquires */
  uint64_t acquire_hits;     /**< acquires that found the copy in place, nothing to wait for */
  uint64_t acquire_misses;   /**< moved the tensor in, waited for its move, or made room */
  uint64_t acquire_stall_ns; /**< time the misses spent in acquire */
  uint64_t prefetches; /**< prefetches queued by the schedule (not counting tm_tensor_prefetch) */
  uint64_t evictions;  /**< copies evicted to make room */
  uint64_t eviction_bytes;     /**< bytes of those copies */
  uint64_t schedule_length;    /**< acquires per step in the schedule (0: none) */
  uint64_t schedule_relearned; /**< steps that departed from the schedule, which was relearned */
  /* Appended in 0.2: memory under pressure. */
  uint64_t prefetches_dropped;            /**< prefetches not done (sum of the three below) */
  uint64_t prefetches_dropped_no_room;    /**< no room without harming an earlier use (or at all) */
  uint64_t prefetches_dropped_demand;     /**< a demand was making room in that tier */
  uint64_t prefetches_dropped_superseded; /**< the tensor was acquired for writing meanwhile */
  uint64_t prefetches_cancelled;          /**< queued prefetches removed for a demand's room */
  uint64_t moves_failed;            /**< asynchronous moves that failed (kept until reported) */
  uint64_t demand_waits;            /**< demand calls that waited for moves in flight */
  uint64_t demand_wait_ns;          /**< time those calls waited */
  uint64_t fragmentation_evictions; /**< evictions made because no hole fit, though the
                                         free bytes sufficed */
  /* Appended in 0.4: inclusive DRAM (TIERMEM_DRAM_INCLUSIVE). */
  uint64_t write_throughs;      /**< offloads that wrote NVMe and kept a clean DRAM copy */
  uint64_t write_through_bytes; /**< bytes of those offloads */
  uint64_t clean_reads;         /**< moves to HBM and copies out to callers (each), acquires in
                                     DRAM (the first after the copy was kept), served by a DRAM
                                     copy a write-through (or read-through) kept, not NVMe */
  uint64_t clean_read_bytes;    /**< bytes of those reads (a copy out: the bytes it served) */
  uint64_t clean_drops;         /**< evictions that freed a clean copy without writing it
                                     (another tier held the bytes); counted in evictions too */
  uint64_t clean_drop_bytes;    /**< bytes of those copies */
  /* Appended in 0.5: recompute callbacks (tm_tensor_set_recompute). */
  uint64_t recompute_drops;      /**< evictions that dropped a tensor's only copy instead of
                                      writing it down: its recompute costs less than the round
                                      trip; counted in evictions too */
  uint64_t recompute_drop_bytes; /**< bytes of those copies */
  uint64_t recomputes;           /**< dropped tensors rebuilt by their callback */
  uint64_t recompute_failures;   /**< callbacks that failed (the tensor stayed dropped) */
  uint64_t recompute_ns;         /**< time spent in the callbacks, failed ones included */
  /* Appended in 0.6: HBM compaction. */
  uint64_t relocations;      /**< copies slid down within HBM so that holes merge (no hole fit a
                                  request though the free bytes were there) */
  uint64_t relocation_bytes; /**< bytes of those copies (device-to-device) */
  /* Appended in 0.6: callers' copies. */
  uint64_t copied_in_bytes;  /**< bytes callers' copies put into tensors (tm_tensor_copy_in,
                                  _copy_in_async, _create_copy_in_async, _write), once each
                                  call succeeded */
  uint64_t copied_out_bytes; /**< bytes callers' copies took out (tm_tensor_copy_out, _read) */
  /* Appended in 0.7: offloads that wait for a release. */
  uint64_t offloads_parked; /**< asynchronous offloads that found no room while callers held
                                 copies, and waited for a release or destroy to try again */
  /* Appended in 0.8: HBM handed on behind copies down. */
  uint64_t hbm_handed_on;       /**< copies down from HBM (offloads, evictions' write-downs)
                                     whose HBM memory was freed once their pieces were enqueued,
                                     each part fenced until its piece had read it */
  uint64_t hbm_handed_on_bytes; /**< bytes of those copies */
  uint64_t moves_behind;        /**< moves into HBM whose memory such a copy down was still
                                     reading: written piece by piece, each after the piece down
                                     it follows (or after all of them) */
  uint64_t moves_behind_bytes;  /**< bytes of those moves */
  /* Appended in 0.9: which asynchronous failures lost something. */
  uint64_t moves_failed_lost; /**< of moves_failed, those that lost bytes: callers'
                                   asynchronous copies (copy_in_async, create_copy_in_async,
                                   copy_out on a stream) whose bytes did not land, and copies down
                                   whose HBM memory was handed on (TIERMEM_HBM_HAND_ON), and
                                   moves whose source, the last valid copy, failed its
                                   checksum (TM_ERR_CORRUPT); the others left their tensors
                                   valid where they were */
  /* Appended in 0.10: DLPack exports out. */
  uint64_t dlpack_exports; /**< tm_tensor_acquire_dlpack exports not yet deleted (each keeps the
                                runtime's memory past tm_runtime_destroy) */
} tm_stats;

#define TM_STATS_INIT                                                                              \
  {                                                                                                \
    sizeof(tm_stats), {{0, 0, 0}}, {{0}}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0                           \
  }

/** What a runtime resolved when it was created. Fill with TM_INFO_INIT. */
typedef struct tm_info {
  size_t struct_size;
  tm_device_kind device;       /**< TM_DEVICE_CUDA or TM_DEVICE_EMULATED: the one in use */
  int32_t cuda_device;         /**< the CUDA ordinal in use; -1 with the emulated device */
  int32_t hbm_device_pointers; /**< 1: HBM addresses are CUDA device pointers; 0: host memory */
  tm_io_engine io_engine;      /**< TM_IO_ENGINE_URING or TM_IO_ENGINE_POSIX */
  int32_t numa_node;           /**< node the DRAM tier is bound to; -1 when unbound */
  uint64_t tier_bytes[TM_TIER_COUNT]; /**< each tier's budget, as resolved */
  uint32_t io_block_size;             /**< bytes per I/O request */
  uint32_t io_queue_depth;            /**< requests in flight per ring */
  uint32_t io_threads;                /**< I/O threads (rings) */
  uint32_t nvme_paths;                /**< swap file directories */
  uint32_t nvme_alignment;            /**< O_DIRECT alignment in bytes (1: buffered) */
  int32_t prefetch_depth;             /**< scheduled uses prefetched ahead */
  uint64_t prefetch_bytes;            /**< bound on prefetch bytes in flight */
  tm_placement placement;             /**< home tiers by class */
  char device_name[128];              /**< a line describing the device, NUL-terminated */
  /* Appended in 0.3. */
  int32_t local_rank;       /**< this process's rank on the node (0 when alone) */
  int32_t local_world_size; /**< processes on the node sharing its budgets (1 when alone) */
  int32_t device_allocator; /**< 1: HBM copies come from tm_config.device_alloc */
} tm_info;

#define TM_INFO_INIT                                                                               \
  {                                                                                                \
    sizeof(tm_info), TM_DEVICE_DEFAULT, -1, 0, TM_IO_ENGINE_DEFAULT, -1, {0, 0, 0}, 0, 0, 0, 0, 0, \
        0, 0, TM_PLACEMENT_DEFAULT, {0}, 0, 1, 0                                                   \
  }

/** A runtime: the tiers, the engines and the tensors. Zero is never a valid handle. */
typedef struct tm_runtime {
  uint64_t bits;
} tm_runtime;

/** A tensor of a runtime. Zero is never a valid handle. */
typedef struct tm_tensor {
  uint64_t bits;
} tm_tensor;

/** Name of a status code ("TM_OK", "TM_ERR_IO", ...); "TM_STATUS_UNKNOWN" when out of range. */
TM_API const char* tm_status_string(tm_status status);

/** Detail of the most recent failure on the calling thread ("" when none). */
TM_API const char* tm_last_error(void);

/** tm_last_error_flags: the failure was the report of asynchronous failures (by a sync or
 *  tm_step_end) each of which was a move between tiers that left its tensor valid where it was.
 *  Nothing was lost: the caller's work stands (repeating a step would apply it twice). */
#define TM_ERROR_NOTHING_LOST 0x1u

/** TM_ERROR_* flags of the most recent failure on the calling thread (0 when none applies,
 *  or no failure yet). Set by the same call as tm_last_error. */
TM_API uint32_t tm_last_error_flags(void);

/** Version of the library loaded at run time. Any pointer may be NULL. */
TM_API tm_status tm_get_version(int* major, int* minor, int* patch);

/** "major.minor.patch" of the library loaded at run time. */
TM_API const char* tm_version_string(void);

/** Name of a tier ("hbm", "dram", "nvme"); "unknown" when out of range. */
TM_API const char* tm_tier_name(tm_tier tier);

/**
 * Creates a runtime: reads the environment, sets up the device, pins the DRAM pool, creates and
 * reserves the swap files. config may be NULL (everything from the environment).
 * Returns TM_ERR_INVALID_ARGUMENT (NULL out, a bad struct_size), TM_ERR_CONFIG for an invalid
 * setting, TM_ERR_DEVICE, TM_ERR_OUT_OF_MEMORY, TM_ERR_NO_SPACE (the swap files could not be
 * reserved), TM_ERR_IO or TM_ERR_UNSUPPORTED (docs/c-api.md). On failure *out is zero.
 */
TM_API tm_status tm_runtime_create(const tm_config* config, tm_runtime* out);

/** Destroys a runtime and every tensor it still holds; its swap files vanish. DLPack exports still
 * out (tm_tensor_acquire_dlpack) keep its memory until the last one's deleter, which frees it. */
TM_API tm_status tm_runtime_destroy(tm_runtime runtime);

/** Fills *out with the runtime's counters. out->struct_size must be set. */
TM_API tm_status tm_runtime_stats(tm_runtime runtime, tm_stats* out);

/**
 * Fills *out with what the runtime resolved: the device actually used (a binding needs to know
 * whether HBM addresses are device or host pointers), the I/O engine, the NUMA node, the
 * budgets. out->struct_size must be set; a smaller (older) struct gets what it has room for.
 */
TM_API tm_status tm_runtime_info(tm_runtime runtime, tm_info* out);

/**
 * Effective value of a configuration setting by its variable name, e.g. "TIERMEM_HBM_BYTES",
 * written to buf as text (NUL-terminated). *needed receives the length including the NUL.
 */
TM_API tm_status tm_runtime_config_value(tm_runtime runtime, const char* name, char* buf,
                                         size_t buf_size, size_t* needed);

/**
 * Creates a tensor. It holds no copy yet and reads as zeros until written; its first acquire or
 * write materializes it.
 */
TM_API tm_status tm_tensor_create(tm_runtime runtime, const tm_tensor_desc* desc, tm_tensor* out);

/**
 * Destroys a tensor and frees its copies. TM_ERR_BUSY while it is acquired, unless every acquire
 * out is a DLPack export (tm_tensor_acquire_dlpack): then the handle is invalid at once and the
 * memory is freed by the last export's deleter.
 */
TM_API tm_status tm_tensor_destroy(tm_runtime runtime, tm_tensor tensor);

/** Size in bytes of a tensor. */
TM_API tm_status tm_tensor_bytes(tm_runtime runtime, tm_tensor tensor, uint64_t* bytes);

/**
 * Copies bytes [offset, offset + bytes) from host memory src into the tensor. The write lands in
 * the fastest tier holding a valid copy (the home tier when none: an NVMe home is written on
 * NVMe, through a staging slot); every other copy becomes stale and is freed. TM_ERR_BUSY if
 * another tier's copy is acquired; a copy acquired for reading in the tier written is written in
 * place.
 */
TM_API tm_status tm_tensor_write(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                 const void* src, uint64_t bytes);

/** Copies bytes [offset, offset + bytes) of the tensor into host memory dst. */
TM_API tm_status tm_tensor_read(tm_runtime runtime, tm_tensor tensor, uint64_t offset, void* dst,
                                uint64_t bytes);

/**
 * Makes the tensor resident in tier (HBM or DRAM), pins it there and returns its address
 * (a device pointer for HBM). With TM_ACCESS_WRITE or TM_ACCESS_READ_WRITE every other copy
 * becomes stale and is freed. stream is a cudaStream_t or NULL: with a stream, a TM_ACCESS_READ
 * copy from DRAM into HBM is stream-ordered (the stream waits on an event; the host does not);
 * every other case returns when the data is in place, which is ordered for any stream. Waits only
 * for this tensor's own moves. Each acquire needs one tm_tensor_release of the same tier.
 */
TM_API tm_status tm_tensor_acquire(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                   tm_access access, void* stream, void** ptr);

/**
 * Unpins one acquire of the tensor in tier. The caller states that all work using the pointer
 * has finished: from now on tiermem may evict, refill, read or offload that memory on its own
 * streams at once. Work still queued on a stream must use tm_tensor_release_on_stream.
 */
TM_API tm_status tm_tensor_release(tm_runtime runtime, tm_tensor tensor, tm_tier tier);

/**
 * Unpins one acquire of the tensor in tier once the work queued so far on stream (a
 * cudaStream_t; NULL: no stream, as tm_tensor_release; (void*)1 for the legacy default
 * stream) has finished, without blocking the host, as
 * PyTorch's record_stream does: an event is recorded on the stream, and the copy is not evicted,
 * refilled, read or offloaded before that event has passed. The pin itself is dropped at once
 * (tm_tensor_destroy and a later acquire do not fail with TM_ERR_BUSY); tiermem waits for the
 * event where it needs the memory. TM_ERR_INVALID_ARGUMENT for a stream that is not a live
 * stream of the runtime's device; TM_ERR_UNSUPPORTED for a stream being captured into a graph.
 */
TM_API tm_status tm_tensor_release_on_stream(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                             void* stream);

/**
 * tm_tensor_release_on_stream (stream NULL: tm_tensor_release) of an acquire made for reading
 * whose memory was written through its pointer after all: in the same call, the copy in tier
 * becomes the tensor's only valid copy, as an acquire for writing makes it (the other tiers'
 * copies are freed; evicting it writes it down), then the pin is dropped. One call, so that a
 * caller interrupted between calls (a signal in a language runtime's finalizer) never leaves a
 * second pin behind, as an acquire for writing and two releases could. Errors, each leaving the
 * pin and every copy as they were: TM_ERR_INVALID_ARGUMENT when the tensor is not acquired in
 * tier (or only by DLPack exports); TM_ERR_BUSY when another tier's copy is pinned, or a step
 * holds the tensor. Appended in 0.1.10.
 */
TM_API tm_status tm_tensor_release_written(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                           void* stream);

/** The element type and layout of a DLPack export (tm_tensor_acquire_dlpack). Fill with
 * TM_DLPACK_LAYOUT_INIT. */
typedef struct tm_dlpack_layout {
  size_t struct_size;     /**< sizeof(tm_dlpack_layout), set by TM_DLPACK_LAYOUT_INIT */
  uint8_t dtype_code;     /**< DLPack's DLDataTypeCode, 0 to 17: 0 int, 1 uint, 2 float, ... */
  uint8_t dtype_bits;     /**< bits of one lane, a multiple of 8 */
  uint16_t dtype_lanes;   /**< 1 for scalars */
  int32_t ndim;           /**< 0 to 64 dimensions */
  const int64_t* shape;   /**< ndim sizes, each >= 0; copied */
  const int64_t* strides; /**< ndim strides in elements, each >= 0; NULL: compact row-major */
  uint64_t byte_offset;   /**< where element 0 lies in the tensor's bytes */
} tm_dlpack_layout;

#define TM_DLPACK_LAYOUT_INIT \
  { sizeof(tm_dlpack_layout), 2, 32, 1, 0, NULL, NULL, 0 }

/**
 * tm_tensor_acquire, handed over as a DLPack tensor: *managed is a DLManagedTensor (DLPack's
 * unversioned struct, the one frameworks take in a "dltensor" capsule: torch.from_dlpack,
 * jax.dlpack, cupy.from_dlpack) viewing the acquired copy with `layout`, on device kDLCUDA (the
 * runtime's GPU) for HBM of a CUDA runtime and kDLCPU otherwise (the emulated device's HBM, and
 * DRAM, are host memory; a kDLCPU export's bytes have landed when this returns, whatever
 * `stream`). Its deleter releases the acquire, on `stream` when one was given (as
 * tm_tensor_release_on_stream), from any thread, and never fails the caller. The tensor lives
 * until then: tm_tensor_destroy while only exports pin it succeeds at once (the handle is invalid
 * from then on) and the tensor's memory goes with the last export's deleter. A consumer that does
 * not take *managed calls its deleter. Unlike tm_tensor_acquire's pointer, an export keeps the
 * runtime's memory past tm_runtime_destroy: the last export's deleter frees the runtime.
 * TM_ERR_INVALID_ARGUMENT, with *managed NULL and nothing acquired, when the
 * layout reaches outside the tensor's bytes or is not one DLPack can describe.
 */
TM_API tm_status tm_tensor_acquire_dlpack(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                          tm_access access, void* stream,
                                          const tm_dlpack_layout* layout, void** managed);

/**
 * Copies bytes [offset, offset + bytes) from the caller's memory src into the tensor and returns
 * once the copy is enqueued. src may be host memory (pageable or pinned) or device memory (told
 * apart by the CUDA runtime): device memory goes straight into the pinned DRAM copy (D2H, never
 * staged through tiermem's HBM), or into the HBM copy when that is where the tensor is valid.
 * The copy lands in the fastest tier holding a valid copy (the home tier when none, DRAM for an
 * NVMe home when DRAM holds it, else through staging onto NVMe); the other copies become stale.
 * With a stream (a cudaStream_t), the copy starts after the work queued on the stream so far and
 * the stream's later work waits for it: the host does not block. Without one, it starts at once.
 * src must not change until tm_tensor_sync returns or the stream has passed the copy.
 */
TM_API tm_status tm_tensor_copy_in(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                   const void* src, uint64_t bytes, void* stream);

/**
 * Copies bytes [offset, offset + bytes) of the tensor into the caller's memory dst (host or
 * device memory) and returns once the copy is enqueued, ordered on stream as tm_tensor_copy_in.
 * A tensor valid in HBM or DRAM is copied from there; one valid only on NVMe is read NVMe ->
 * DRAM staging -> dst in pipelined chunks (the reads run on the calling thread). For the
 * schedule it is a use in DRAM: a prefetch to DRAM ahead of it leaves only the last copy to do.
 * dst holds the bytes once tm_tensor_sync returns or the stream has passed the copy.
 */
TM_API tm_status tm_tensor_copy_out(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                    void* dst, uint64_t bytes, void* stream);

/**
 * As tm_tensor_copy_in, except that the caller's stream does not wait for the copy: the copy
 * starts on tiermem's copy stream after an event recorded on stream (the work queued on it so
 * far; NULL: at once), and the stream's later work goes on without it, so that a copy out of a
 * compute stream's memory never stalls that stream. The caller learns when src may be reused
 * or freed from tm_tensor_copy_done (a query that never blocks) or tm_tensor_sync (which
 * waits); until then src must stay unchanged and allocated. Later operations on the tensor are
 * ordered after the copy (a copy_out on the device, the others on the host). tm_tensor_destroy does
 * not wait for it: the tensor's memory is freed once the copy has landed, and src must stay
 * allocated until it has (query before destroying). Host memory into a DRAM copy with no stream
 * (and no caller's stream still using that copy) is copied before the call returns, as by
 * tm_tensor_copy_in.
 */
TM_API tm_status tm_tensor_copy_in_async(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                         const void* src, uint64_t bytes, void* stream);

/**
 * Whether the tensor's copies to and from callers' memory (tm_tensor_copy_in, _copy_in_async,
 * _copy_out) have all landed, without blocking: *done is 1 when no such copy is in flight, so
 * that every source may be reused and every destination read, and 0 otherwise. A copy that
 * failed counts as done; its failure is reported by tm_tensor_sync / tm_runtime_sync.
 */
TM_API tm_status tm_tensor_copy_done(tm_runtime runtime, tm_tensor tensor, int32_t* done);

/**
 * tm_tensor_create, tm_tensor_copy_in_async of the whole tensor (desc->bytes from src at offset
 * 0, after the work queued on stream so far) and tm_tensor_copy_done, in one call: a
 * framework's pack of a saved tensor crosses the boundary once. *done is 1 when the copy has
 * landed already (src may be reused at once), 0 when it is in flight (ask tm_tensor_copy_done
 * later). On failure no tensor is left (*out is zero, *done 0) and the status and message are
 * those of the step that failed. Symbol version TIERMEM_0.1.5.
 */
TM_API tm_status tm_tensor_create_copy_in_async(tm_runtime runtime, const tm_tensor_desc* desc,
                                                const void* src, void* stream, tm_tensor* out,
                                                int32_t* done);

/**
 * Starts moving the tensor down to tier (DRAM or NVMe) and returns at once: a valid copy is
 * written there, then the copies above it are freed. TM_ERR_BUSY at once when a copy above tier
 * is acquired. A failure of the move itself (TM_ERR_OUT_OF_MEMORY, TM_ERR_NO_SPACE, TM_ERR_IO)
 * leaves the tensor valid where it was and is reported by tm_tensor_sync / tm_runtime_sync.
 */
TM_API tm_status tm_tensor_offload(tm_runtime runtime, tm_tensor tensor, tm_tier tier);

/**
 * Starts bringing the tensor up to tier (HBM or DRAM) ahead of use and returns at once; the
 * copies below stay valid. A later acquire waits only for this tensor's move. A prefetch is a
 * hint: when there is no room (without evicting a pinned copy or waiting) it is dropped and
 * counted in tm_stats.prefetches_dropped, never reported as a failure. Other failures of the move
 * (TM_ERR_IO, TM_ERR_CORRUPT) are reported by tm_tensor_sync / tm_runtime_sync.
 */
TM_API tm_status tm_tensor_prefetch(tm_runtime runtime, tm_tensor tensor, tm_tier tier);

/**
 * Waits until the tensor's prefetches and offloads are done (and any stream-ordered copy has
 * landed). Returns the first failure among them, once; TM_OK when all succeeded.
 */
TM_API tm_status tm_tensor_sync(tm_runtime runtime, tm_tensor tensor);

/**
 * Waits for every queued and running move of the runtime; returns the first failure (and how
 * many failed), once. Failures are kept until reported, even when their tensor was destroyed.
 * A prefetch that found no room is not a failure: it is dropped and counted in tm_stats.
 */
TM_API tm_status tm_runtime_sync(tm_runtime runtime);

/**
 * Marks the start of a training step. The acquires of each step are recorded; the first step's
 * order becomes the schedule, and from the next step on the runtime prefetches the next
 * TIERMEM_PREFETCH_DEPTH scheduled tensors and evicts the one used furthest in the future.
 */
TM_API tm_status tm_step_begin(tm_runtime runtime);

/**
 * Marks the end of a step. A step that departed from the schedule replaces it. Returns the
 * asynchronous failures kept so far (as tm_runtime_sync does, without waiting).
 */
TM_API tm_status tm_step_end(tm_runtime runtime);

/**
 * Sets the schedule explicitly: the order in which a step acquires tensors, and for each the
 * tier (tiers may be NULL: all HBM). Replayed from the next acquire on, within steps.
 */
TM_API tm_status tm_schedule_set(tm_runtime runtime, const tm_tensor* tensors, const tm_tier* tiers,
                                 size_t count);

/** Bit mask (TM_TIER_BIT) of the tiers holding a valid copy; 0 for a never-written tensor. */
TM_API tm_status tm_tensor_residency(tm_runtime runtime, tm_tensor tensor, uint32_t* mask);

/* ---- Recompute: a tensor rebuilt by the caller instead of written down (appended in 0.5) ---- */

/**
 * Rebuilds the bytes of a dropped tensor (see tm_tensor_set_recompute): writes all `bytes` of
 * them to dst, an address in `tier` (TM_TIER_HBM: a device pointer when tm_info.
 * hbm_device_pointers is 1; TM_TIER_DRAM: pinned host memory). stream is the stream of the
 * operation that needs the bytes (the acquire's or copy_out's; NULL for none): work may be
 * queued on it, but the bytes must be in dst, for any stream, when the callback returns (as after
 * cudaStreamSynchronize). Returns TM_OK when every byte is written; any other tm_status is a
 * failure, reported by the operation that needed the bytes.
 */
typedef tm_status (*tm_recompute_fn)(void* user, tm_tensor tensor, tm_tier tier, void* dst,
                                     uint64_t bytes, void* stream);

/**
 * Gives the tensor a callback that rebuilds its bytes, and what a rebuild costs in seconds
 * (measured by the caller: a forward of the layer that made it, say). Under pressure, when the
 * runtime would write the tensor's only copy one tier down to make room, it drops the copy
 * instead when cost_seconds is less than the round trip it saves: bytes / bandwidth down plus
 * bytes / bandwidth back up, at TIERMEM_LINK_GBPS from HBM and TIERMEM_NVME_GBPS from DRAM. A
 * dropped tensor has no copy anywhere (residency 0) but stays a live handle: its next acquire
 * (TM_ACCESS_READ or _READ_WRITE), tm_tensor_read, tm_tensor_copy_out or partial write calls fn
 * to rebuild it in the tier it is needed in, then serves it; an acquire for TM_ACCESS_WRITE or a
 * whole write replaces it without a call. fn is called on the thread of that operation, never
 * on tiermem's own threads and never under the runtime's lock (prefetches skip a dropped
 * tensor); it may use tiermem on other tensors (acquire its inputs), never on this one. When fn
 * fails, the operation fails with fn's status and a message naming the tensor; the tensor stays
 * dropped (nothing half-filled is ever served) and a later operation calls fn again.
 * fn NULL clears the callback (cost_seconds must then be 0); a dropped tensor is rebuilt first,
 * so that clearing never loses its bytes. TM_ERR_INVALID_ARGUMENT for a cost that is negative,
 * NaN or infinite, or a nonzero cost with fn NULL. user is passed to fn as is; it must stay
 * valid until the callback is cleared or the tensor destroyed.
 */
TM_API tm_status tm_tensor_set_recompute(tm_runtime runtime, tm_tensor tensor, tm_recompute_fn fn,
                                         void* user, double cost_seconds);

/* ---- Planner: activation memory, recompute and offload, priced from measured bandwidths ---- */

/** The rungs of the ladder, in the order they are tried. */
typedef enum tm_plan_rung {
  TM_PLAN_KEEP_ALL = 0,                /**< every activation kept */
  TM_PLAN_SELECTIVE_RECOMPUTE = 1,     /**< attention core recomputed */
  TM_PLAN_FULL_RECOMPUTE = 2,          /**< per-layer recompute: one more forward */
  TM_PLAN_OPTIMIZER_OFFLOAD = 3,       /**< Adam state in DRAM (ZeRO-Offload) */
  TM_PLAN_ACTIVATION_OFFLOAD_DRAM = 4, /**< activations offloaded to DRAM */
  TM_PLAN_ACTIVATION_OFFLOAD_NVME = 5, /**< activations offloaded to NVMe */
  TM_PLAN_PARAMETER_OFFLOAD = 6,       /**< parameters too, on NVMe (ZeRO-Infinity) */
  TM_PLAN_RUNG_COUNT,
  TM_PLAN_RUNG_MIN_ENUM = -0x7fffffff - 1,
  TM_PLAN_RUNG_MAX_ENUM = 0x7fffffff
} tm_plan_rung;

/** The model and the machine. Fill with TM_PLAN_INPUT_INIT. Units: bytes, bytes/s, FLOP/s. */
typedef struct tm_plan_input {
  size_t struct_size;
  double layers, hidden, heads, seq, micro_batch;
  double tensor_parallel;    /**< t, default 1 */
  int32_t sequence_parallel; /**< nonzero: sequence parallelism with t */
  int32_t flash_attention;   /**< nonzero: attention scores never stored */
  double params;             /**< parameters of the whole model */
  double bytes_per_element;  /**< activation element size, default 2 */
  double hbm_bytes;          /**< HBM budget per GPU */
  double link_bytes_per_s;   /**< HBM <-> DRAM per direction */
  double nvme_bytes_per_s;   /**< DRAM <-> NVMe; 0: no NVMe rungs */
  double flops_per_s;        /**< achieved compute per GPU */
  /* Added with the CPU optimizer step; a caller built before passes the smaller struct_size,
   * and reads as dram_bytes_per_s 0, optimizer_bytes_per_param 28. */
  double dram_bytes_per_s;          /**< the CPU Adam step's bandwidth; 0: optimizer offload n/a */
  double optimizer_bytes_per_param; /**< DRAM traffic of the CPU step per parameter (28) */
} tm_plan_input;

#define TM_PLAN_INPUT_INIT \
  { sizeof(tm_plan_input), 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 28 }

typedef struct tm_plan_rung_result {
  double hbm_bytes;     /**< needed per GPU */
  double added_seconds; /**< per step, over keeping everything */
  int32_t fits;         /**< within hbm_bytes */
  int32_t available;    /**< 0: needs NVMe and none was given */
} tm_plan_rung_result;

typedef struct tm_plan_result {
  size_t struct_size;
  double activation_full;       /**< bytes per layer per GPU, no recomputation */
  double activation_selective;  /**< ... with selective recomputation */
  double activation_checkpoint; /**< ... with full recomputation (the layer's input) */
  double model_state;           /**< bytes per GPU: 16 per parameter (mixed-precision Adam) */
  double forward_flops;         /**< per step per GPU */
  double step_compute_seconds;  /**< forward + backward */
  tm_plan_rung_result rungs[TM_PLAN_RUNG_COUNT]; /**< the ladder: each rung on those before */
  int32_t recommended; /**< highest rung of the recommended combination, -1: nothing fits */
  /* Added with the combinations; a caller built before passes the smaller struct_size. */
  uint32_t recommended_rungs;       /**< TM_PLAN_RUNG_BIT set of the recommended combination */
  double recommended_hbm_bytes;     /**< what it needs per GPU */
  double recommended_added_seconds; /**< what it adds per step, the CPU optimizer step included */
  double optimizer_step_seconds;    /**< the CPU step over DRAM; 0 without dram_bytes_per_s */
  double backward_seconds;          /**< backward alone (2x forward), before recompute */
  /* Added with the optimizer's state on NVMe; a caller built before passes a smaller
   * struct_size. The CPU step with its state on NVMe (CPUAdam(state_tier="nvme")) streams the
   * state through DRAM in slices: any DRAM budget runs it, and a small one runs it at the
   * disk's speed (docs/planner.md). */
  double optimizer_state_bytes;           /**< the CPU step's fp32 state per GPU: 12 B/param */
  double optimizer_nvme_seconds;          /**< that state read and written once at nvme_bytes_per_s;
                                               0 without it */
  double optimizer_nvme_least_dram_bytes; /**< the least DRAM tier the NVMe step runs in */
  double optimizer_nvme_full_speed_dram_bytes; /**< the DRAM tier for the disk's speed; 0
                                                    without nvme_bytes_per_s */
} tm_plan_result;

#define TM_PLAN_RUNG_BIT(rung) (1u << (rung))

#define TM_PLAN_RESULT_INIT \
  { sizeof(tm_plan_result), 0, 0, 0, 0, 0, 0, {{0, 0, 0, 0}}, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/**
 * Prices every combination of rungs for the input (docs/planner.md) and recommends the one that
 * fits with the least added time (ties: fewer rungs). TM_ERR_INVALID_ARGUMENT naming the field
 * for a missing or out-of-range input.
 */
TM_API tm_status tm_plan(const tm_plan_input* input, tm_plan_result* out);

/** Name of a rung ("selective recompute", ...); "unknown" when out of range. */
TM_API const char* tm_plan_rung_name(tm_plan_rung rung);

/* ---- The CPU Adam (ZeRO-Offload's optimizer), appended in 0.4 ---- */

/** Element types of gradients and of the updated parameter's copy. */
typedef enum tm_dtype {
  TM_DTYPE_F32 = 0,
  TM_DTYPE_BF16 = 1, /**< bfloat16 */
  TM_DTYPE_F16 = 2,  /**< IEEE half */
  TM_DTYPE_COUNT,
  TM_DTYPE_MIN_ENUM = -0x7fffffff - 1,
  TM_DTYPE_MAX_ENUM = 0x7fffffff
} tm_dtype;

/** Instruction sets the Adam kernel comes in, lowest first. */
typedef enum tm_optim_isa {
  TM_OPTIM_ISA_BASELINE = 0, /**< portable x86-64 (SSE2), one element at a time */
  TM_OPTIM_ISA_AVX2 = 1,     /**< AVX2 + FMA + F16C, 8 floats a step */
  TM_OPTIM_ISA_AVX512 = 2,   /**< AVX-512F, 16 floats a step */
  TM_OPTIM_ISA_COUNT,
  TM_OPTIM_ISA_MIN_ENUM = -0x7fffffff - 1,
  TM_OPTIM_ISA_MAX_ENUM = 0x7fffffff
} tm_optim_isa;

/** Hyperparameters and workers of a CPU Adam. Fill with TM_ADAM_CONFIG_INIT. */
typedef struct tm_adam_config {
  size_t struct_size;  /**< sizeof(tm_adam_config), set by TM_ADAM_CONFIG_INIT */
  double lr;           /**< learning rate, >= 0 (default 1e-3) */
  double beta1;        /**< in [0, 1) (default 0.9) */
  double beta2;        /**< in [0, 1) (default 0.999) */
  double eps;          /**< >= 0 (default 1e-8) */
  double weight_decay; /**< >= 0 (default 0.01) */
  int32_t adamw;       /**< 1: decoupled weight decay (AdamW); 0: Adam, L2 added to the gradient */
  int32_t amsgrad;     /**< 1: keep and use the maximum of the second moments */
  int32_t threads;     /**< workers; 0: the cores of the NUMA node (all cores when unbound) */
  int32_t numa_node;   /**< TM_NUMA_DEFAULT: the runtime's DRAM node; TM_NUMA_OFF: unbound */
} tm_adam_config;

#define TM_ADAM_CONFIG_INIT \
  { sizeof(tm_adam_config), 1e-3, 0.9, 0.999, 1e-8, 1e-2, 1, 0, 0, TM_NUMA_DEFAULT }

/** A CPU Adam: hyperparameters and a pool of workers. Zero is never a valid handle. */
typedef struct tm_adam {
  uint64_t bits;
} tm_adam;

/** Parameters and their state in the caller's host memory, count fp32 elements each. */
typedef struct tm_adam_span {
  float* param;          /**< fp32 master weights, updated in place */
  float* exp_avg;        /**< first moment, updated in place */
  float* exp_avg_sq;     /**< second moment, updated in place */
  float* max_exp_avg_sq; /**< with amsgrad: the running maximum of exp_avg_sq; else NULL */
  const void* grad;      /**< gradients, count elements of grad_dtype */
  tm_dtype grad_dtype;
  void* param_out;          /**< optional: the updated parameter as param_out_dtype; or NULL */
  tm_dtype param_out_dtype; /**< bf16 and fp16 round to nearest even; NaN and Inf kept */
  uint64_t count;
} tm_adam_span;

/** A bucket whose state lives in a tiermem tensor, in any tier. */
typedef struct tm_adam_bucket {
  /** count fp32 master weights, then count exp_avg, count exp_avg_sq, and with amsgrad count
      max_exp_avg_sq, back to back: at least 12 (16) * count bytes. */
  tm_tensor state;
  uint64_t count;
  const void* grad; /**< host memory, count elements of grad_dtype */
  tm_dtype grad_dtype;
  void* param_out; /**< optional host buffer for the updated parameter; or NULL */
  tm_dtype param_out_dtype;
} tm_adam_bucket;

/**
 * Creates a CPU Adam. runtime may be the zero handle for tm_adam_step alone; tm_adam_step_buckets
 * needs the runtime whose tensors it steps, and takes its NUMA node and prefetch depth from it.
 * The workers are bound to the cores of config->numa_node. TM_ERR_INVALID_ARGUMENT naming the
 * field for a bad value.
 */
TM_API tm_status tm_adam_create(tm_runtime runtime, const tm_adam_config* config, tm_adam* out);
TM_API tm_status tm_adam_destroy(tm_adam adam);
/** Changes the hyperparameters (lr ... amsgrad; threads and numa_node are ignored) for the
    following steps, as a learning-rate schedule does. */
TM_API tm_status tm_adam_set_hyper(tm_adam adam, const tm_adam_config* config);
/** The number of workers in use. */
TM_API tm_status tm_adam_threads(tm_adam adam, int32_t* threads);

/**
 * Takes Adam step number step (from 1) over the spans in one fused pass, on the workers. Each
 * gradient is first multiplied by grad_scale (1: none; a clipping coefficient). Every span is
 * checked first (TM_ERR_INVALID_ARGUMENT naming the span and its field), so a bad one steps
 * nothing. In fp32 the result matches torch.optim.AdamW(foreach=False) (or Adam with adamw = 0)
 * elementwise within the tolerance of docs/c-api.md (the vector kernels fuse multiply-adds).
 */
TM_API tm_status tm_adam_step(tm_adam adam, uint64_t step, float grad_scale,
                              const tm_adam_span* spans, size_t count);

/**
 * The same step over state held in tiermem tensors, all or nothing. State on NVMe is read into
 * DRAM (bucket k+1..k+prefetch_depth read while bucket k steps), stepped out of place into a
 * shadow tensor the optimizer keeps (the same size, on NVMe) and written back while the next
 * buckets step; state only in DRAM is pinned and stepped in place at the end. Only once every
 * new version is written are states and shadows swapped (no copy) and param_out written. When
 * any read or write fails (TM_ERR_IO, TM_ERR_CORRUPT, ...), the call returns that failure naming
 * the bucket with *buckets_done = 0, and every state and param_out is as before: calling again
 * once the cause is gone takes the step. On success *buckets_done = count (may be NULL).
 */
TM_API tm_status tm_adam_step_buckets(tm_adam adam, uint64_t step, float grad_scale,
                                      const tm_adam_bucket* buckets, size_t count,
                                      size_t* buckets_done);

/** Buckets stepped with their own hyperparameters and step number: a torch parameter group (or
    those of its parameters at one step count). */
typedef struct tm_adam_group {
  const tm_adam_config* config; /**< lr .. amsgrad of the group (threads, numa_node ignored);
                                     NULL: the optimizer's (tm_adam_create / tm_adam_set_hyper) */
  uint64_t step;                /**< the step number taken, from 1 */
  const tm_adam_bucket* buckets;
  size_t count;
} tm_adam_group;

/**
 * tm_adam_step_buckets over several groups at once, all or nothing across them: when any bucket
 * of any group fails, the call returns that failure naming "group g, bucket i", *buckets_done is
 * 0 and every group's states and param_out are as before. On success *buckets_done is the sum of
 * the groups' counts (may be NULL). The optimizer's own hyperparameters are not changed.
 */
TM_API tm_status tm_adam_step_groups(tm_adam adam, float grad_scale, const tm_adam_group* groups,
                                     size_t count, size_t* buckets_done);

/**
 * tm_adam_step_groups in two halves, so that several processes (the ranks of a data-parallel
 * job) take a step all or none of them: each prepares, they agree on the outcome (one
 * collective of their own), then each commits, or each aborts. Prepare does everything that can
 * fail: every NVMe state's new version read, stepped and written beside the old one, the DRAM
 * state pinned; it returns that failure as tm_adam_step_groups does, nothing changed and nothing
 * pending. Once it returns TM_OK the step waits: the states are held (writes by any thread,
 * another optimizer's step of them and their destroy refused with TM_ERR_BUSY, another step of
 * this optimizer refused too), and the gradients and param_out buffers must stay valid and
 * unchanged. tm_adam_step_commit takes it (*buckets_done
 * as tm_adam_step_groups'); it fails only when a state was acquired meanwhile against the
 * hold's rules, and then aborts. tm_adam_step_abort leaves every state and param_out as before
 * (TM_OK also with nothing prepared). tm_adam_destroy aborts a step left prepared.
 */
TM_API tm_status tm_adam_step_groups_prepare(tm_adam adam, float grad_scale,
                                             const tm_adam_group* groups, size_t count);
TM_API tm_status tm_adam_step_commit(tm_adam adam, size_t* buckets_done);
TM_API tm_status tm_adam_step_abort(tm_adam adam);

/** tm_adam_step_groups_extend's flags. */
enum {
  /**
   * The part's param_out buffers are the caller's scratch, not the live parameters: a bucket
   * whose state is on NVMe writes its updated parameter there as it steps, during the call,
   * instead of at the commit (nothing is staged for it). The caller moves them where they go
   * and makes them count only if the step is committed.
   */
  TM_ADAM_OUT_SCRATCH = 1u << 0
};

/**
 * Adds groups to the step prepared by tm_adam_step_groups_prepare, to be committed or aborted
 * with it as one step: an optimizer stepped piece by piece (the units of a sharded model, one in
 * memory at a time) stays all or nothing. grad_scale is this part's; flags 0 or
 * TM_ADAM_OUT_SCRATCH. A failure (with the message tm_adam_step_groups_prepare would give)
 * undoes this part only: the parts prepared before stay prepared, for the caller to commit or
 * abort. A bucket whose state is on NVMe has read its gradient when this returns, and writes
 * its param_out at the commit (with TM_ADAM_OUT_SCRATCH: before this returns); a bucket whose
 * state is only in DRAM reads its gradient and writes its param_out at the commit, so both must
 * stay valid until then. TM_ERR_INVALID_ARGUMENT with no step prepared; a state already in the
 * step is refused with TM_ERR_BUSY. tm_adam_step_groups_prepare with count 0 prepares an empty
 * step, for every part to be added by this call.
 */
TM_API tm_status tm_adam_step_groups_extend(tm_adam adam, float grad_scale,
                                            const tm_adam_group* groups, size_t count,
                                            uint32_t flags);

/** The best instruction set this CPU runs, and the one the kernels use now (either may be NULL). */
TM_API tm_status tm_optim_isa_get(tm_optim_isa* detected, tm_optim_isa* active);
/** Caps the instruction set the kernels use, process-wide (a cap above the CPU's is lowered to
    it), for tests of each kernel and for comparisons. *active (may be NULL): the one now in use. */
TM_API tm_status tm_optim_set_isa_limit(tm_optim_isa limit, tm_optim_isa* active);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TIERMEM_TIERMEM_H_ */
