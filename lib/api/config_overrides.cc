// tm_config -> ConfigOverrides: the fields a caller set (zero or a _DEFAULT means unset), each
// checked, read only as far as the caller's struct_size reaches (older callers pass less).
#include "lib/api/config_overrides.h"

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "lib/base/caller_struct.h"
#include "lib/base/status.h"

namespace tiermem {
namespace {

// Sets `out` from an enum field of tm_config by its table; TM_ERR_CONFIG naming the field when
// the value is in no row.
template <typename E>
absl::Status Choose(const char* field, int value, std::initializer_list<std::pair<int, E>> rows,
                    std::optional<E>& out) {
  for (const auto& [c_value, e] : rows) {
    if (c_value == value) {
      out = e;
      return absl::OkStatus();
    }
  }
  return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.%s=%d is out of range", field, value));
}

absl::Status NonNegative(const char* field, int value) {
  if (value >= 0) return absl::OkStatus();
  return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.%s=%d is negative", field, value));
}

#define TM_HAS(field) (size >= offsetof(tm_config, field) + sizeof(c->field))

// The device, its memory and the framework's allocator.
absl::Status DeviceOverrides(const tm_config* c, size_t size, ConfigOverrides& o) {
  if (TM_HAS(device) && c->device != TM_DEVICE_DEFAULT) {
    auto s = Choose<DeviceKind>("device", c->device,
                                {{TM_DEVICE_AUTO, DeviceKind::kAuto},
                                 {TM_DEVICE_CUDA, DeviceKind::kCuda},
                                 {TM_DEVICE_EMULATED, DeviceKind::kEmulated}},
                                o.device);
    if (!s.ok()) return s;
  }
  if (TM_HAS(cuda_device) && c->cuda_device != TM_CUDA_DEVICE_DEFAULT) {
    if (auto s = NonNegative("cuda_device", c->cuda_device); !s.ok()) return s;
    o.cuda_device = c->cuda_device;
  }
  if (TM_HAS(hbm_bytes) && c->hbm_bytes != 0) o.hbm_bytes = SizeSetting{c->hbm_bytes, 0};
  if (TM_HAS(emu_link_gbps) && c->emu_link_gbps != 0) o.emu_link_gbps = c->emu_link_gbps;
  if (TM_HAS(device_allocator_user)) {
    if ((c->device_alloc == nullptr) != (c->device_free == nullptr)) {
      return Error(TM_ERR_CONFIG,
                   "tm_config.device_alloc and tm_config.device_free must be set together");
    }
    o.device_allocator.alloc = c->device_alloc;
    o.device_allocator.free = c->device_free;
    o.device_allocator.user = c->device_allocator_user;
  }
  return absl::OkStatus();
}

// Host memory, NVMe and the I/O engine.
absl::Status StorageOverrides(const tm_config* c, size_t size, ConfigOverrides& o) {
  if (TM_HAS(dram_bytes) && c->dram_bytes != 0) o.dram_bytes = SizeSetting{c->dram_bytes, 0};
  if (TM_HAS(nvme_paths) && c->nvme_paths != nullptr) o.nvme_paths = std::string(c->nvme_paths);
  if (TM_HAS(nvme_bytes) && c->nvme_bytes != 0) o.nvme_bytes = SizeSetting{c->nvme_bytes, 0};
  if (TM_HAS(io_engine) && c->io_engine != TM_IO_ENGINE_DEFAULT) {
    auto s = Choose<IoEngineKind>("io_engine", c->io_engine,
                                  {{TM_IO_ENGINE_AUTO, IoEngineKind::kAuto},
                                   {TM_IO_ENGINE_URING, IoEngineKind::kUring},
                                   {TM_IO_ENGINE_POSIX, IoEngineKind::kPosix}},
                                  o.io_engine);
    if (!s.ok()) return s;
  }
  if (TM_HAS(io_block_size) && c->io_block_size != 0) o.io_block_size = c->io_block_size;
  if (TM_HAS(io_queue_depth) && c->io_queue_depth != 0) o.io_queue_depth = c->io_queue_depth;
  if (TM_HAS(io_threads) && c->io_threads != 0) o.io_threads = c->io_threads;
  if (TM_HAS(numa_node) && c->numa_node != TM_NUMA_DEFAULT) {
    if (c->numa_node == TM_NUMA_AUTO) {
      o.numa = std::pair{NumaMode::kAuto, -1};
    } else if (c->numa_node == TM_NUMA_OFF) {
      o.numa = std::pair{NumaMode::kOff, -1};
    } else if (c->numa_node >= 0) {
      o.numa = std::pair{NumaMode::kNode, static_cast<int>(c->numa_node)};
    } else {
      return Error(TM_ERR_CONFIG,
                   absl::StrFormat("tm_config.numa_node=%d is out of range", c->numa_node));
    }
  }
  if (TM_HAS(checksum) && c->checksum != TM_CHECKSUM_DEFAULT) {
    auto s = Choose<ChecksumKind>(
        "checksum", c->checksum,
        {{TM_CHECKSUM_OFF, ChecksumKind::kOff}, {TM_CHECKSUM_XXH3, ChecksumKind::kXxh3}},
        o.checksum);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Prefetching, placement, logging, the trace and the ranks.
absl::Status PolicyOverrides(const tm_config* c, size_t size, ConfigOverrides& o) {
  if (TM_HAS(prefetch_depth) && c->prefetch_depth != TM_PREFETCH_DEPTH_DEFAULT) {
    if (auto s = NonNegative("prefetch_depth", c->prefetch_depth); !s.ok()) return s;
    o.prefetch_depth = static_cast<uint32_t>(c->prefetch_depth);
  }
  if (TM_HAS(prefetch_bytes) && c->prefetch_bytes != 0) {
    o.prefetch_bytes = SizeSetting{c->prefetch_bytes, 0};
  }
  if (TM_HAS(placement) && c->placement != TM_PLACEMENT_DEFAULT) {
    auto s = Choose<Placement>("placement", c->placement,
                               {{TM_PLACEMENT_NONE, Placement::kNone},
                                {TM_PLACEMENT_ZERO_OFFLOAD, Placement::kZeroOffload},
                                {TM_PLACEMENT_ZERO_INFINITY, Placement::kZeroInfinity},
                                {TM_PLACEMENT_ACTIVATIONS, Placement::kActivations}},
                               o.placement);
    if (!s.ok()) return s;
  }
  if (TM_HAS(log_level) && c->log_level != TM_LOG_DEFAULT) {
    if (c->log_level < TM_LOG_ERROR || c->log_level >= TM_LOG_LEVEL_COUNT) {
      return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.log_level=%d is out of range",
                                                  static_cast<int>(c->log_level)));
    }
    o.log_level = static_cast<LogLevel>(c->log_level);
  }
  if (TM_HAS(trace) && c->trace != nullptr) o.trace = std::string(c->trace);
  if (TM_HAS(local_rank) && c->local_rank != TM_LOCAL_RANK_DEFAULT) {
    if (auto s = NonNegative("local_rank", c->local_rank); !s.ok()) return s;
    o.local_rank = c->local_rank;
  }
  if (TM_HAS(local_world_size) && c->local_world_size != TM_LOCAL_RANK_DEFAULT) {
    if (c->local_world_size < 1) {
      return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.local_world_size=%d is not positive",
                                                  c->local_world_size));
    }
    o.local_world_size = c->local_world_size;
  }
  return absl::OkStatus();
}

#undef TM_HAS

}  // namespace

absl::StatusOr<ConfigOverrides> OverridesFrom(const tm_config* c) {
  ConfigOverrides o;
  if (c == nullptr) return o;
  const size_t size = c->struct_size;
  if (auto s = CheckCallerStruct(size, offsetof(tm_config, device), sizeof(tm_config),
                                 alignof(tm_config), "tm_config", "TM_CONFIG_INIT");
      !s.ok()) {
    return s;
  }
  // Within a major version the struct only grows (struct_size tells how far); across one,
  // fields may have changed meaning.
  if (c->api_version / 10000 != TM_VERSION_MAJOR) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_config.api_version is %u (tiermem %u.%u.%u), and this library "
                                 "is tiermem %d.%d.%d: major versions do not mix; fill the struct "
                                 "with TM_CONFIG_INIT from this library's header",
                                 c->api_version, c->api_version / 10000, c->api_version / 100 % 100,
                                 c->api_version % 100, TM_VERSION_MAJOR, TM_VERSION_MINOR,
                                 TM_VERSION_PATCH));
  }
  for (auto part : {DeviceOverrides, StorageOverrides, PolicyOverrides}) {
    if (auto s = part(c, size, o); !s.ok()) return s;
  }
  return o;
}

}  // namespace tiermem
