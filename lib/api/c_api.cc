// The extern "C" boundary, runtimes: create (tm_config read through lib/api/config_overrides),
// destroy, stats, info, settings, syncs, steps and the schedule. Handles checked, statuses
// converted, no exception crosses it.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "io/log.h"
#include "lib/api/c_boundary.h"
#include "lib/api/config_overrides.h"

using namespace tiermem;  // NOLINT: the C entry points below implement the tm_* ABI

extern "C" {

TM_API const char* tm_last_error(void) { return LastError(); }

TM_API uint32_t tm_last_error_flags(void) { return LastErrorFlags(); }

TM_API tm_status tm_runtime_create(const tm_config* config, tm_runtime* out) {
  if (out == nullptr) return NullArgument("tm_runtime_create", "out");
  out->bits = 0;
  try {
    auto overrides = OverridesFrom(config);
    if (!overrides.ok()) return Report(overrides.status());
    auto cfg = LoadConfig(*overrides, ProcessEnvironment(), ProcessTiermemVariables());
    if (!cfg.ok()) return Fail(TM_ERR_CONFIG, cfg.status().message());
    auto rt = Runtime::Create(*cfg);
    if (!rt.ok()) return Report(rt.status());
    out->bits = Registry().Add(std::shared_ptr<Runtime>(std::move(*rt)));
    return TM_OK;
  } catch (const std::bad_alloc&) {
    return Fail(TM_ERR_OUT_OF_MEMORY, "host memory exhausted (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Fail(TM_ERR_INTERNAL, absl::StrFormat("unexpected exception: %s", e.what()));
  }
}

TM_API tm_status tm_runtime_destroy(tm_runtime runtime) {
  bool inherited = false;
  std::shared_ptr<Runtime> r = Registry().Remove(runtime.bits, &inherited);
  if (r == nullptr) return RuntimeRegistry::BadHandle("runtime", runtime.bits);
  // Freed when the last call using it returns, or with the last DLPack export of its memory;
  // made before a fork, kept whole (a child's).
  if (!inherited) {
    if (const uint64_t n = r->ExportsOut(); n > 0) {
      io::Log(io::LogSeverity::kWarn,
              "tm_runtime_destroy: %llu DLPack export(s) of its tensors are still out: the "
              "runtime's memory stays until the last of them is deleted",
              static_cast<unsigned long long>(n));
    }
  }
  return TM_OK;
}

TM_API tm_status tm_runtime_stats(tm_runtime runtime, tm_stats* out) {
  if (out == nullptr) return NullArgument("tm_runtime_stats", "out");
  if (out->struct_size < offsetof(tm_stats, tensors) || out->struct_size > (1u << 16)) {
    return Fail(TM_ERR_INVALID_ARGUMENT,
                absl::StrFormat("tm_stats.struct_size is %zu: initialize it with TM_STATS_INIT",
                                out->struct_size));
  }
  return WithRuntime(runtime, [&](Runtime& rt) {
    tm_stats s = rt.Stats();
    size_t n = out->struct_size < sizeof s ? out->struct_size : sizeof s;
    size_t keep = out->struct_size;
    std::memcpy(out, &s, n);
    out->struct_size = keep;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_runtime_info(tm_runtime runtime, tm_info* out) {
  if (out == nullptr) return NullArgument("tm_runtime_info", "out");
  if (out->struct_size < offsetof(tm_info, cuda_device) || out->struct_size > (1u << 16)) {
    return Fail(TM_ERR_INVALID_ARGUMENT,
                absl::StrFormat("tm_info.struct_size is %zu: initialize it with TM_INFO_INIT",
                                out->struct_size));
  }
  return WithRuntime(runtime, [&](Runtime& rt) {
    const RuntimeInfo& info = rt.info();
    const Config& c = rt.config();
    tm_info r = TM_INFO_INIT;
    const bool cuda = info.device_kind == "cuda";
    r.device = cuda ? TM_DEVICE_CUDA : TM_DEVICE_EMULATED;
    r.cuda_device = cuda ? info.cuda_device : -1;
    r.hbm_device_pointers = cuda ? 1 : 0;
    r.io_engine = info.io_engine == "uring" ? TM_IO_ENGINE_URING : TM_IO_ENGINE_POSIX;
    r.numa_node = info.numa_node;
    for (int t = 0; t < TM_TIER_COUNT; ++t) r.tier_bytes[t] = info.tier_bytes[t];
    r.io_block_size = c.io_block_size;
    r.io_queue_depth = c.io_queue_depth;
    r.io_threads = c.io_threads;
    r.nvme_paths = static_cast<uint32_t>(info.nvme.size());
    for (const auto& p : info.nvme) r.nvme_alignment = std::max(r.nvme_alignment, p.alignment);
    r.prefetch_depth = static_cast<int32_t>(c.prefetch_depth);
    r.prefetch_bytes = info.prefetch_bytes;
    r.placement = static_cast<tm_placement>(static_cast<int>(c.placement) + TM_PLACEMENT_NONE);
    r.device_allocator = c.device_allocator.set() ? 1 : 0;
    r.local_rank = c.local_rank;
    r.local_world_size = c.local_world_size;
    const size_t n = std::min(info.device.size(), sizeof r.device_name - 1);
    std::memcpy(r.device_name, info.device.data(), n);
    r.device_name[n] = '\0';
    const size_t keep = out->struct_size;
    std::memcpy(out, &r, std::min(keep, sizeof r));
    out->struct_size = keep;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_runtime_config_value(tm_runtime runtime, const char* name, char* buf,
                                         size_t buf_size, size_t* needed) {
  if (name == nullptr) return NullArgument("tm_runtime_config_value", "name");
  if (buf == nullptr && buf_size > 0) return NullArgument("tm_runtime_config_value", "buf");
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto v = rt.config().Value(name);
    if (!v.has_value()) {
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrFormat("\"%s\" is not a tiermem setting", name));
    }
    if (needed != nullptr) *needed = v->size() + 1;
    if (buf_size < v->size() + 1) {
      if (buf_size > 0) buf[0] = '\0';
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrFormat("buffer of %zu bytes is too small for %s (needs %zu)", buf_size,
                                   name, v->size() + 1));
    }
    std::memcpy(buf, v->c_str(), v->size() + 1);
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_sync(tm_runtime runtime, tm_tensor tensor) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Sync(tensor.bits); });
}

TM_API tm_status tm_runtime_sync(tm_runtime runtime) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.SyncAll(); });
}

TM_API tm_status tm_step_begin(tm_runtime runtime) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.StepBegin(); });
}

TM_API tm_status tm_step_end(tm_runtime runtime) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.StepEnd(); });
}

TM_API tm_status tm_schedule_set(tm_runtime runtime, const tm_tensor* tensors, const tm_tier* tiers,
                                 size_t count) {
  if (tensors == nullptr && count > 0) return NullArgument("tm_schedule_set", "tensors");
  // More uses than any step holds is a caller's mistake (a negative count cast to size_t).
  if (count > (size_t{1} << 32)) {
    return Fail(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("tm_schedule_set: count=%zu is beyond any schedule (at most 2^32)", count));
  }
  return WithRuntime(runtime, [&](Runtime& rt) {
    std::vector<Runtime::ScheduledUse> uses(count);
    for (size_t i = 0; i < count; ++i) {
      uses[i] = {tensors[i].bits, tiers != nullptr ? tiers[i] : TM_TIER_HBM};
    }
    return rt.SetSchedule(uses);
  });
}

}  // extern "C"
