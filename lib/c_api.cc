// The extern "C" boundary: handles checked, statuses converted, no exception crosses it.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/sync.h"
#include "lib/config.h"
#include "lib/handle.h"
#include "lib/last_error.h"
#include "lib/planner.h"
#include "lib/runtime.h"
#include "lib/status.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

tm_status Fail(tm_status code, absl::string_view message) {
  LastErrorSlot().assign(message.data(), message.size());
  return code;
}

tm_status Report(const absl::Status& s) {
  if (s.ok()) return TM_OK;
  return Fail(ToTmStatus(s), s.message());
}

// Runtimes live in a process-wide table of generation-checked slots, their handles tagged with
// the runtime kind (lib/handle.h). Calls hold a shared_ptr, so a destroy racing with a call
// frees the runtime only after that call returns.
class RuntimeRegistry {
 public:
  uint64_t Add(std::shared_ptr<Runtime> rt) {
    MutexLock lock(&mu_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    next_generation_ = NextHandleGeneration(next_generation_);
    slots_[index] = {next_generation_, std::move(rt)};
    return MakeHandle(HandleKind::kRuntime, next_generation_, index);
  }
  std::shared_ptr<Runtime> Get(uint64_t bits) {
    MutexLock lock(&mu_);
    Slot* s = Find(bits);
    return s != nullptr ? s->runtime : nullptr;
  }
  std::shared_ptr<Runtime> Remove(uint64_t bits) {
    MutexLock lock(&mu_);
    Slot* s = Find(bits);
    if (s == nullptr) return nullptr;
    std::shared_ptr<Runtime> rt = std::move(s->runtime);
    s->generation = 0;
    free_.push_back(static_cast<uint32_t>(bits));
    return rt;
  }

 private:
  struct Slot {
    uint32_t generation = 0;
    std::shared_ptr<Runtime> runtime;
  };
  Slot* Find(uint64_t bits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // A tensor handle never names a runtime, whatever its generation and index bits.
    if (!HandleIsKind(bits, HandleKind::kRuntime)) return nullptr;
    const uint32_t index = HandleIndex(bits);
    const uint32_t gen = HandleGeneration(bits);
    if (gen == 0 || index >= slots_.size() || slots_[index].generation != gen) return nullptr;
    return &slots_[index];
  }
  Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  uint32_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

RuntimeRegistry& Registry() {
  static RuntimeRegistry* r = new RuntimeRegistry();  // never destroyed: safe at exit
  return *r;
}

// Runs `body` with the runtime of `rt`, turning a bad handle or an exception into a status.
template <typename Body>
tm_status WithRuntime(tm_runtime rt, Body&& body) {
  std::shared_ptr<Runtime> r = Registry().Get(rt.bits);
  if (r == nullptr) {
    return Fail(TM_ERR_INVALID_HANDLE,
                absl::StrFormat("runtime handle 0x%016x is zero, destroyed or invalid", rt.bits));
  }
  try {
    return Report(body(*r));
  } catch (const std::bad_alloc&) {
    return Fail(TM_ERR_OUT_OF_MEMORY, "host memory exhausted (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Fail(TM_ERR_INTERNAL, absl::StrFormat("unexpected exception: %s", e.what()));
  } catch (...) {
    return Fail(TM_ERR_INTERNAL, "unexpected exception");
  }
}

tm_status NullArgument(const char* function, const char* argument) {
  return Fail(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: %s is NULL", function, argument));
}

absl::StatusOr<ConfigOverrides> OverridesFrom(const tm_config* c) {
  ConfigOverrides o;
  if (c == nullptr) return o;
  // Older callers pass a smaller struct: only the fields it contains are read.
  const size_t size = c->struct_size;
  if (size < offsetof(tm_config, device) || size > (1u << 16)) {
    return Error(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("tm_config.struct_size is %zu: fill the struct with TM_CONFIG_INIT", size));
  }
#define TM_HAS(field) (size >= offsetof(tm_config, field) + sizeof(c->field))
  if (TM_HAS(device) && c->device != TM_DEVICE_DEFAULT) {
    switch (c->device) {
      case TM_DEVICE_AUTO:
        o.device = DeviceKind::kAuto;
        break;
      case TM_DEVICE_CUDA:
        o.device = DeviceKind::kCuda;
        break;
      case TM_DEVICE_EMULATED:
        o.device = DeviceKind::kEmulated;
        break;
      default:
        return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.device=%d is out of range",
                                                    static_cast<int>(c->device)));
    }
  }
  if (TM_HAS(cuda_device) && c->cuda_device != TM_CUDA_DEVICE_DEFAULT) {
    if (c->cuda_device < 0) {
      return Error(TM_ERR_CONFIG,
                   absl::StrFormat("tm_config.cuda_device=%d is negative", c->cuda_device));
    }
    o.cuda_device = c->cuda_device;
  }
  if (TM_HAS(hbm_bytes) && c->hbm_bytes != 0) o.hbm_bytes = SizeSetting{c->hbm_bytes, 0};
  if (TM_HAS(dram_bytes) && c->dram_bytes != 0) o.dram_bytes = SizeSetting{c->dram_bytes, 0};
  if (TM_HAS(nvme_paths) && c->nvme_paths != nullptr) o.nvme_paths = std::string(c->nvme_paths);
  if (TM_HAS(nvme_bytes) && c->nvme_bytes != 0) o.nvme_bytes = SizeSetting{c->nvme_bytes, 0};
  if (TM_HAS(io_engine) && c->io_engine != TM_IO_ENGINE_DEFAULT) {
    switch (c->io_engine) {
      case TM_IO_ENGINE_AUTO:
        o.io_engine = IoEngineKind::kAuto;
        break;
      case TM_IO_ENGINE_URING:
        o.io_engine = IoEngineKind::kUring;
        break;
      case TM_IO_ENGINE_POSIX:
        o.io_engine = IoEngineKind::kPosix;
        break;
      default:
        return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.io_engine=%d is out of range",
                                                    static_cast<int>(c->io_engine)));
    }
  }
  if (TM_HAS(io_block_size) && c->io_block_size != 0) o.io_block_size = c->io_block_size;
  if (TM_HAS(io_queue_depth) && c->io_queue_depth != 0) o.io_queue_depth = c->io_queue_depth;
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
  if (TM_HAS(log_level) && c->log_level != TM_LOG_DEFAULT) {
    if (c->log_level < TM_LOG_ERROR || c->log_level >= TM_LOG_LEVEL_COUNT) {
      return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.log_level=%d is out of range",
                                                  static_cast<int>(c->log_level)));
    }
    o.log_level = static_cast<LogLevel>(c->log_level);
  }
  if (TM_HAS(emu_link_gbps) && c->emu_link_gbps != 0) o.emu_link_gbps = c->emu_link_gbps;
  if (TM_HAS(io_threads) && c->io_threads != 0) o.io_threads = c->io_threads;
  if (TM_HAS(prefetch_depth) && c->prefetch_depth != TM_PREFETCH_DEPTH_DEFAULT) {
    if (c->prefetch_depth < 0) {
      return Error(TM_ERR_CONFIG,
                   absl::StrFormat("tm_config.prefetch_depth=%d is negative", c->prefetch_depth));
    }
    o.prefetch_depth = static_cast<uint32_t>(c->prefetch_depth);
  }
  if (TM_HAS(prefetch_bytes) && c->prefetch_bytes != 0) {
    o.prefetch_bytes = SizeSetting{c->prefetch_bytes, 0};
  }
  if (TM_HAS(placement) && c->placement != TM_PLACEMENT_DEFAULT) {
    switch (c->placement) {
      case TM_PLACEMENT_NONE:
        o.placement = Placement::kNone;
        break;
      case TM_PLACEMENT_ZERO_OFFLOAD:
        o.placement = Placement::kZeroOffload;
        break;
      case TM_PLACEMENT_ZERO_INFINITY:
        o.placement = Placement::kZeroInfinity;
        break;
      case TM_PLACEMENT_ACTIVATIONS:
        o.placement = Placement::kActivations;
        break;
      default:
        return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.placement=%d is out of range",
                                                    static_cast<int>(c->placement)));
    }
  }
  if (TM_HAS(trace) && c->trace != nullptr) o.trace = std::string(c->trace);
  if (TM_HAS(checksum) && c->checksum != TM_CHECKSUM_DEFAULT) {
    switch (c->checksum) {
      case TM_CHECKSUM_OFF:
        o.checksum = ChecksumKind::kOff;
        break;
      case TM_CHECKSUM_XXH3:
        o.checksum = ChecksumKind::kXxh3;
        break;
      default:
        return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.checksum=%d is out of range",
                                                    static_cast<int>(c->checksum)));
    }
  }
  if (TM_HAS(device_allocator_user)) {
    if ((c->device_alloc == nullptr) != (c->device_free == nullptr)) {
      return Error(TM_ERR_CONFIG,
                   "tm_config.device_alloc and tm_config.device_free must be set together");
    }
    o.device_allocator.alloc = c->device_alloc;
    o.device_allocator.free = c->device_free;
    o.device_allocator.user = c->device_allocator_user;
  }
  if (TM_HAS(local_rank) && c->local_rank != TM_LOCAL_RANK_DEFAULT) {
    if (c->local_rank < 0) {
      return Error(TM_ERR_CONFIG,
                   absl::StrFormat("tm_config.local_rank=%d is negative", c->local_rank));
    }
    o.local_rank = c->local_rank;
  }
  if (TM_HAS(local_world_size) && c->local_world_size != TM_LOCAL_RANK_DEFAULT) {
    if (c->local_world_size < 1) {
      return Error(TM_ERR_CONFIG, absl::StrFormat("tm_config.local_world_size=%d is not positive",
                                                  c->local_world_size));
    }
    o.local_world_size = c->local_world_size;
  }
#undef TM_HAS
  return o;
}

}  // namespace
}  // namespace tiermem

using namespace tiermem;  // NOLINT: the C entry points below implement the tm_* ABI

extern "C" {

TM_API const char* tm_last_error(void) { return LastErrorSlot().c_str(); }

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
  std::shared_ptr<Runtime> r = Registry().Remove(runtime.bits);
  if (r == nullptr) {
    return Fail(
        TM_ERR_INVALID_HANDLE,
        absl::StrFormat("runtime handle 0x%016x is zero, destroyed or invalid", runtime.bits));
  }
  return TM_OK;  // freed when the last call using it returns
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

TM_API tm_status tm_tensor_create(tm_runtime runtime, const tm_tensor_desc* desc, tm_tensor* out) {
  if (desc == nullptr) return NullArgument("tm_tensor_create", "desc");
  if (out == nullptr) return NullArgument("tm_tensor_create", "out");
  out->bits = 0;
  if (desc->struct_size < offsetof(tm_tensor_desc, name) + sizeof(desc->name) ||
      desc->struct_size > (1u << 16)) {
    return Fail(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("tm_tensor_desc.struct_size is %zu: fill it with TM_TENSOR_DESC_INIT",
                        desc->struct_size));
  }
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    TensorDesc d;
    d.bytes = desc->bytes;
    d.cls = desc->cls;
    d.home_tier = desc->home_tier;
    // At most 256 bytes are kept, cut before a UTF-8 character rather than inside one (one
    // byte more is read to see whether the cut falls inside a character).
    if (desc->name != nullptr) {
      const absl::string_view given(desc->name, strnlen(desc->name, 257));
      d.name = std::string(Utf8Prefix(given, 256));
    }
    auto h = rt.CreateTensor(d);
    if (!h.ok()) return h.status();
    out->bits = *h;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_destroy(tm_runtime runtime, tm_tensor tensor) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.DestroyTensor(tensor.bits); });
}

TM_API tm_status tm_tensor_bytes(tm_runtime runtime, tm_tensor tensor, uint64_t* bytes) {
  if (bytes == nullptr) return NullArgument("tm_tensor_bytes", "bytes");
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto b = rt.TensorBytes(tensor.bits);
    if (!b.ok()) return b.status();
    *bytes = *b;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_write(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                 const void* src, uint64_t bytes) {
  if (src == nullptr && bytes > 0) return NullArgument("tm_tensor_write", "src");
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.Write(tensor.bits, offset, src, bytes); });
}

TM_API tm_status tm_tensor_read(tm_runtime runtime, tm_tensor tensor, uint64_t offset, void* dst,
                                uint64_t bytes) {
  if (dst == nullptr && bytes > 0) return NullArgument("tm_tensor_read", "dst");
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.Read(tensor.bits, offset, dst, bytes); });
}

TM_API tm_status tm_tensor_acquire(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                   tm_access access, void* stream, void** ptr) {
  if (ptr == nullptr) return NullArgument("tm_tensor_acquire", "ptr");
  *ptr = nullptr;
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto p = rt.Acquire(tensor.bits, tier, access, stream);
    if (!p.ok()) return p.status();
    *ptr = *p;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_release(tm_runtime runtime, tm_tensor tensor, tm_tier tier) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Release(tensor.bits, tier); });
}

TM_API tm_status tm_tensor_release_on_stream(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                             void* stream) {
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.ReleaseOnStream(tensor.bits, tier, stream); });
}

TM_API tm_status tm_tensor_copy_in(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                   const void* src, uint64_t bytes, void* stream) {
  if (src == nullptr && bytes > 0) return NullArgument("tm_tensor_copy_in", "src");
  return WithRuntime(
      runtime, [&](Runtime& rt) { return rt.CopyIn(tensor.bits, offset, src, bytes, stream); });
}

TM_API tm_status tm_tensor_copy_out(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                    void* dst, uint64_t bytes, void* stream) {
  if (dst == nullptr && bytes > 0) return NullArgument("tm_tensor_copy_out", "dst");
  return WithRuntime(
      runtime, [&](Runtime& rt) { return rt.CopyOut(tensor.bits, offset, dst, bytes, stream); });
}

TM_API tm_status tm_tensor_offload(tm_runtime runtime, tm_tensor tensor, tm_tier tier) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Offload(tensor.bits, tier); });
}

TM_API tm_status tm_tensor_prefetch(tm_runtime runtime, tm_tensor tensor, tm_tier tier) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Prefetch(tensor.bits, tier); });
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

TM_API tm_status tm_plan(const tm_plan_input* in, tm_plan_result* out) {
  if (in == nullptr) return NullArgument("tm_plan", "input");
  if (out == nullptr) return NullArgument("tm_plan", "out");
  if (in->struct_size != sizeof(tm_plan_input) || out->struct_size != sizeof(tm_plan_result)) {
    return Fail(
        TM_ERR_INVALID_ARGUMENT,
        "tm_plan: struct_size mismatch: fill with TM_PLAN_INPUT_INIT / TM_PLAN_RESULT_INIT");
  }
  PlanInput p;
  p.layers = in->layers;
  p.hidden = in->hidden;
  p.heads = in->heads;
  p.seq = in->seq;
  p.micro_batch = in->micro_batch;
  p.tensor_parallel = in->tensor_parallel;
  p.sequence_parallel = in->sequence_parallel != 0;
  p.flash_attention = in->flash_attention != 0;
  p.params = in->params;
  p.bytes_per_element = in->bytes_per_element;
  p.hbm_bytes = in->hbm_bytes;
  p.link_bytes_per_s = in->link_bytes_per_s;
  p.nvme_bytes_per_s = in->nvme_bytes_per_s;
  p.flops_per_s = in->flops_per_s;
  auto plan = MakePlan(p);
  if (!plan.ok()) return Fail(TM_ERR_INVALID_ARGUMENT, plan.status().message());
  out->activation_full = plan->activation_full;
  out->activation_selective = plan->activation_selective;
  out->activation_checkpoint = plan->activation_checkpoint;
  out->model_state = plan->model_state;
  out->forward_flops = plan->forward_flops;
  out->step_compute_seconds = plan->step_compute_seconds;
  for (int i = 0; i < kRungCount; ++i) {
    const RungResult& r = plan->rungs[i];
    out->rungs[i] = {r.hbm_bytes, r.added_seconds, r.fits ? 1 : 0, r.available ? 1 : 0};
  }
  out->recommended = plan->recommended;
  return TM_OK;
}

TM_API const char* tm_plan_rung_name(tm_plan_rung rung) {
  if (rung < 0 || rung >= TM_PLAN_RUNG_COUNT) return "unknown";
  return RungName(static_cast<Rung>(rung));
}

TM_API tm_status tm_tensor_residency(tm_runtime runtime, tm_tensor tensor, uint32_t* mask) {
  if (mask == nullptr) return NullArgument("tm_tensor_residency", "mask");
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto m = rt.Residency(tensor.bits);
    if (!m.ok()) return m.status();
    *mask = *m;
    return absl::OkStatus();
  });
}

}  // extern "C"
