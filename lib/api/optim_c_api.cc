// The C boundary of the CPU Adam: handles checked, arguments named in errors, statuses converted.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "io/numa.h"
#include "io/sync.h"
#include "lib/api/c_boundary.h"
#include "lib/base/caller_struct.h"
#include "lib/base/status.h"
#include "lib/optim/adam_optimizer.h"
#include "lib/optim/bucket_step.h"
#include "lib/runtime/runtime.h"
#include "tiermem/tiermem.h"

namespace tiermem::optim {
namespace {

struct AdamHandle {
  tm_runtime runtime{0};
  int prefetch_depth = 0;
  Mutex mu;  // one step at a time per optimizer
  std::unique_ptr<AdamOptimizer> opt;
  StepVersions versions ABSL_GUARDED_BY(mu);
  // A step prepared (tm_adam_step_groups_prepare) and not yet committed or aborted, with the
  // tensor operations it goes through; destroyed (aborting it) before the versions are
  // forgotten.
  std::unique_ptr<StateTensors> pending_tensors ABSL_GUARDED_BY(mu);
  std::unique_ptr<PreparedStep> pending ABSL_GUARDED_BY(mu);
};

using AdamRegistry = HandleRegistry<AdamHandle, HandleKind::kAdam>;

AdamRegistry& Adams() {
  static AdamRegistry* r = new AdamRegistry();  // never destroyed: safe at exit
  return *r;
}

template <typename Body>
tm_status WithAdam(tm_adam adam, Body&& body) {
  return Adams().With(adam.bits, "adam", std::forward<Body>(body));
}

absl::StatusOr<AdamHyper> HyperFrom(const char* function, const tm_adam_config* c) {
  if (c == nullptr) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: config is NULL", function));
  }
  if (auto s = CheckCallerStruct(c->struct_size, sizeof(tm_adam_config), sizeof(tm_adam_config),
                                 alignof(tm_adam_config), "tm_adam_config", "TM_ADAM_CONFIG_INIT");
      !s.ok()) {
    return WithContext(s, function);
  }
  AdamHyper h;
  h.lr = c->lr;
  h.beta1 = c->beta1;
  h.beta2 = c->beta2;
  h.eps = c->eps;
  h.weight_decay = c->weight_decay;
  if (c->adamw != 0 && c->adamw != 1) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: config->adamw = %d, want 0 or 1", function, c->adamw));
  }
  if (c->amsgrad != 0 && c->amsgrad != 1) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: config->amsgrad = %d, want 0 or 1", function, c->amsgrad));
  }
  h.decoupled = c->adamw == 1;
  h.amsgrad = c->amsgrad == 1;
  if (absl::Status s = ValidateHyper(h); !s.ok()) {
    return WithContext(s, absl::StrFormat("%s: config", function));
  }
  return h;
}

// The node the workers go on, and how many there are by default.
absl::Status ResolveWorkers(const tm_adam_config& c, tm_runtime runtime, int* node, int* threads,
                            int* prefetch_depth) {
  *node = -1;
  *prefetch_depth = 0;
  if (runtime.bits != 0) {
    tm_info info = TM_INFO_INIT;
    if (tm_status s = tm_runtime_info(runtime, &info); s != TM_OK) {
      return Error(s, absl::StrFormat("tm_adam_create: runtime: %s", LastError()));
    }
    *prefetch_depth = std::max(0, info.prefetch_depth);
    if (c.numa_node == TM_NUMA_DEFAULT) *node = info.numa_node;
  }
  if (c.numa_node >= 0) {
    *node = c.numa_node;
  } else if (c.numa_node != TM_NUMA_DEFAULT && c.numa_node != TM_NUMA_OFF) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_adam_create: config->numa_node = %d, want a node, "
                                 "TM_NUMA_DEFAULT or TM_NUMA_OFF",
                                 c.numa_node));
  }
  if (c.threads < 0 || c.threads > 1024) {
    return Error(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("tm_adam_create: config->threads = %d, want 0 to 1024", c.threads));
  }
  *threads = c.threads;
  auto topo = io::Topology::Load(/*with_pci=*/false);
  // A node asked for by number must exist, as TIERMEM_NUMA's must (the runtime refuses one that
  // does not): workers left unbound would be a silent surprise on a multi-socket host.
  if (c.numa_node >= 0 && topo.ok() && !(*topo)->HasNode(c.numa_node)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_adam_create: config->numa_node = %d: no such NUMA node (this "
                                 "machine has %d)",
                                 c.numa_node, (*topo)->NodeCount()));
  }
  if (*threads == 0) {
    *threads = topo.ok() ? (*topo)->CoresOfNode(*node)
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return absl::OkStatus();
}

absl::Status FromC(tm_status code) {
  return code == TM_OK ? absl::OkStatus() : Error(code, LastError());
}

// The pipeline's tensor operations through the C API's handles.
class HandleStateTensors : public StateTensors {
 public:
  explicit HandleStateTensors(tm_runtime rt) : rt_(rt) {}
  absl::StatusOr<uint64_t> Bytes(uint64_t t) override {
    uint64_t b = 0;
    if (tm_status s = tm_tensor_bytes(rt_, {t}, &b); s != TM_OK) return FromC(s);
    return b;
  }
  absl::StatusOr<uint32_t> Residency(uint64_t t) override {
    uint32_t m = 0;
    if (tm_status s = tm_tensor_residency(rt_, {t}, &m); s != TM_OK) return FromC(s);
    return m;
  }
  absl::Status Prefetch(uint64_t t, tm_tier tier) override {
    return FromC(tm_tensor_prefetch(rt_, {t}, tier));
  }
  absl::StatusOr<void*> Acquire(uint64_t t, tm_tier tier, tm_access access) override {
    // As tm_tensor_acquire, but a use the schedule does not learn: the pipeline reads ahead
    // itself (Runtime::Acquire).
    void* p = nullptr;
    const tm_status s = WithRuntime(rt_, [&](Runtime& r) -> absl::Status {
      auto got = r.Acquire(t, tier, access, nullptr, false, /*scheduled=*/false);
      if (!got.ok()) return got.status();
      p = *got;
      return absl::OkStatus();
    });
    if (s != TM_OK) return FromC(s);
    return p;
  }
  absl::Status Release(uint64_t t, tm_tier tier) override {
    return FromC(tm_tensor_release(rt_, {t}, tier));
  }
  absl::Status Hold(uint64_t t) override {
    return FromC(WithRuntime(rt_, [&](Runtime& r) { return r.HoldForStep(t); }));
  }
  void Unhold(uint64_t t) override {
    (void)WithRuntime(rt_, [&](Runtime& r) {
      r.UnholdForStep(t);
      return absl::OkStatus();
    });
  }
  void Seal(uint64_t t) override {
    (void)WithRuntime(rt_, [&](Runtime& r) {
      r.SealForStep(t);
      return absl::OkStatus();
    });
  }
  absl::Status Offload(uint64_t t, tm_tier tier) override {
    return FromC(tm_tensor_offload(rt_, {t}, tier));
  }
  absl::Status Sync(uint64_t t) override { return FromC(tm_tensor_sync(rt_, {t})); }
  absl::StatusOr<uint64_t> Create(uint64_t bytes, const std::string& name) override {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.cls = TM_CLASS_OPTIMIZER_STATE;
    d.home_tier = TM_TIER_NVME;
    d.name = name.c_str();
    tm_tensor t{0};
    if (tm_status s = tm_tensor_create(rt_, &d, &t); s != TM_OK) return FromC(s);
    return t.bits;
  }
  absl::Status Destroy(uint64_t t) override { return FromC(tm_tensor_destroy(rt_, {t})); }
  absl::Status SwapContents(const std::vector<std::pair<uint64_t, uint64_t>>& pairs) override {
    return FromC(WithRuntime(rt_, [&](Runtime& r) { return r.SwapContents(pairs); }));
  }
  absl::StatusOr<uint64_t> DramCapacity() override {
    tm_stats st = TM_STATS_INIT;
    if (tm_status s = tm_runtime_stats(rt_, &st); s != TM_OK) return FromC(s);
    return st.tiers[TM_TIER_DRAM].capacity;
  }
  absl::Status DropClean(uint64_t t) override {
    return FromC(WithRuntime(rt_, [&](Runtime& r) { return r.DropCleanCopy(t, TM_TIER_DRAM); }));
  }

 private:
  tm_runtime rt_;
};

// The caller's groups, their configs checked, for a step of `h`: refused while a prepared step
// waits for its commit or abort (it holds the states), or without a runtime.
// `extending`: groups for the step prepared (tm_adam_step_groups_extend), not a new one.
absl::StatusOr<std::vector<BucketGroup>> InnerGroups(AdamHandle& h, const char* function,
                                                     const tm_adam_group* groups, size_t count,
                                                     bool extending = false)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
  if (groups == nullptr && count > 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: groups is NULL", function));
  }
  if (h.runtime.bits == 0) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: the optimizer was created without a runtime", function));
  }
  if (h.pending != nullptr && !extending) {
    return Error(TM_ERR_BUSY, absl::StrFormat("%s: a prepared step waits for "
                                              "tm_adam_step_commit or tm_adam_step_abort",
                                              function));
  }
  std::vector<BucketGroup> inner(count);
  for (size_t g = 0; g < count; ++g) {
    inner[g].hyper = h.opt->hyper();
    if (groups[g].config != nullptr) {
      const std::string where = absl::StrFormat("%s: group %zu", function, g);
      auto hyper = HyperFrom(where.c_str(), groups[g].config);
      if (!hyper.ok()) return hyper.status();
      inner[g].hyper = *hyper;
    }
    inner[g].step = groups[g].step;
    inner[g].buckets = groups[g].buckets;
    inner[g].count = groups[g].count;
  }
  return inner;
}

bool ValidIsa(tm_optim_isa isa) { return isa >= TM_OPTIM_ISA_BASELINE && isa < TM_OPTIM_ISA_COUNT; }

}  // namespace
}  // namespace tiermem::optim

using namespace tiermem;         // NOLINT: the C entry points below implement the tm_* API
using namespace tiermem::optim;  // NOLINT

extern "C" {

TM_API tm_status tm_adam_create(tm_runtime runtime, const tm_adam_config* config, tm_adam* out) {
  if (out == nullptr) return Fail(TM_ERR_INVALID_ARGUMENT, "tm_adam_create: out is NULL");
  out->bits = 0;
  return Guarded([&] {
    auto hyper = HyperFrom("tm_adam_create", config);
    if (!hyper.ok()) return Report(hyper.status());
    int node = -1, threads = 1, depth = 0;
    if (absl::Status s = ResolveWorkers(*config, runtime, &node, &threads, &depth); !s.ok()) {
      return Report(s);
    }
    auto opt = AdamOptimizer::Create(*hyper, threads, node);
    if (!opt.ok()) return Report(WithContext(opt.status(), "tm_adam_create"));
    auto h = std::make_shared<AdamHandle>();
    h->runtime = runtime;
    h->prefetch_depth = depth;
    h->opt = std::move(*opt);
    out->bits = Adams().Add(std::move(h));
    return TM_OK;
  });
}

TM_API tm_status tm_adam_destroy(tm_adam adam) {
  bool inherited = false;
  std::shared_ptr<AdamHandle> h = Adams().Remove(adam.bits, &inherited);
  if (h == nullptr) return AdamRegistry::BadHandle("adam", adam.bits);
  if (inherited) return TM_OK;  // made before this process forked: kept whole, not touched
  return Guarded([&] {
    MutexLock lock(&h->mu);
    h->pending.reset();  // a prepared step not taken: aborted, nothing changed
    h->pending_tensors.reset();
    HandleStateTensors tensors(h->runtime);
    h->versions.Forget(tensors);  // the shadow states (gone already with their runtime)
    return TM_OK;
  });
}

TM_API tm_status tm_adam_set_hyper(tm_adam adam, const tm_adam_config* config) {
  return WithAdam(adam, [&](AdamHandle& h) {
    auto hyper = HyperFrom("tm_adam_set_hyper", config);
    if (!hyper.ok()) return Report(hyper.status());
    MutexLock lock(&h.mu);
    return Report(h.opt->SetHyper(*hyper));
  });
}

TM_API tm_status tm_adam_threads(tm_adam adam, int32_t* threads) {
  if (threads == nullptr) return Fail(TM_ERR_INVALID_ARGUMENT, "tm_adam_threads: threads is NULL");
  return WithAdam(adam, [&](AdamHandle& h) {
    *threads = h.opt->threads();
    return TM_OK;
  });
}

TM_API tm_status tm_adam_step(tm_adam adam, uint64_t step, float grad_scale,
                              const tm_adam_span* spans, size_t count) {
  if (spans == nullptr && count > 0) {
    return Fail(TM_ERR_INVALID_ARGUMENT, "tm_adam_step: spans is NULL");
  }
  return WithAdam(adam, [&](AdamHandle& h) {
    std::vector<AdamSpan> inner(count);
    for (size_t i = 0; i < count; ++i) {
      const tm_adam_span& s = spans[i];
      inner[i] = {s.param,
                  s.exp_avg,
                  s.exp_avg_sq,
                  s.max_exp_avg_sq,
                  s.grad,
                  static_cast<Dtype>(s.grad_dtype),
                  s.param_out,
                  static_cast<Dtype>(s.param_out_dtype),
                  static_cast<size_t>(s.count)};
    }
    MutexLock lock(&h.mu);
    return Report(WithContext(h.opt->Step(step, grad_scale, inner.data(), count), "tm_adam_step"));
  });
}

TM_API tm_status tm_adam_step_buckets(tm_adam adam, uint64_t step, float grad_scale,
                                      const tm_adam_bucket* buckets, size_t count,
                                      size_t* buckets_done) {
  if (buckets_done != nullptr) *buckets_done = 0;
  if (buckets == nullptr && count > 0) {
    return Fail(TM_ERR_INVALID_ARGUMENT, "tm_adam_step_buckets: buckets is NULL");
  }
  return WithAdam(adam, [&](AdamHandle& h) {
    if (h.runtime.bits == 0) {
      return Fail(TM_ERR_INVALID_ARGUMENT,
                  "tm_adam_step_buckets: the optimizer was created without a runtime");
    }
    if (step == 0) {
      return Fail(TM_ERR_INVALID_ARGUMENT,
                  "tm_adam_step_buckets: step = 0, want the step number from 1");
    }
    MutexLock lock(&h.mu);
    if (h.pending != nullptr) {
      return Fail(TM_ERR_BUSY,
                  "tm_adam_step_buckets: a prepared step waits for tm_adam_step_commit or "
                  "tm_adam_step_abort");
    }
    HandleStateTensors tensors(h.runtime);
    BucketStepResult r = StepBuckets(*h.opt, tensors, h.versions, h.prefetch_depth, step,
                                     grad_scale, buckets, count);
    if (buckets_done != nullptr) *buckets_done = r.buckets_done;
    return Report(WithContext(r.status, "tm_adam_step_buckets"));
  });
}

TM_API tm_status tm_adam_step_groups(tm_adam adam, float grad_scale, const tm_adam_group* groups,
                                     size_t count, size_t* buckets_done) {
  if (buckets_done != nullptr) *buckets_done = 0;
  constexpr const char* kFunction = "tm_adam_step_groups";
  return WithAdam(adam, [&](AdamHandle& h) {
    MutexLock lock(&h.mu);
    auto inner = InnerGroups(h, kFunction, groups, count);
    if (!inner.ok()) return Report(inner.status());
    HandleStateTensors tensors(h.runtime);
    BucketStepResult r =
        StepGroups(*h.opt, tensors, h.versions, h.prefetch_depth, grad_scale, *inner);
    if (buckets_done != nullptr) *buckets_done = r.buckets_done;
    return Report(WithContext(r.status, kFunction));
  });
}

TM_API tm_status tm_adam_step_groups_prepare(tm_adam adam, float grad_scale,
                                             const tm_adam_group* groups, size_t count) {
  constexpr const char* kFunction = "tm_adam_step_groups_prepare";
  return WithAdam(adam, [&](AdamHandle& h) {
    MutexLock lock(&h.mu);
    auto inner = InnerGroups(h, kFunction, groups, count);
    if (!inner.ok()) return Report(inner.status());
    auto tensors = std::make_unique<HandleStateTensors>(h.runtime);
    auto prepared = PrepareGroups(*h.opt, *tensors, h.versions, h.prefetch_depth, grad_scale,
                                  *std::move(inner));
    if (!prepared.ok()) return Report(WithContext(prepared.status(), kFunction));
    h.pending_tensors = std::move(tensors);
    h.pending = *std::move(prepared);
    return TM_OK;
  });
}

TM_API tm_status tm_adam_step_groups_extend(tm_adam adam, float grad_scale,
                                            const tm_adam_group* groups, size_t count,
                                            uint32_t flags) {
  constexpr const char* kFunction = "tm_adam_step_groups_extend";
  if ((flags & ~static_cast<uint32_t>(TM_ADAM_OUT_SCRATCH)) != 0) {
    return Fail(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("%s: flags = %#x, want 0 or TM_ADAM_OUT_SCRATCH", kFunction, flags));
  }
  return WithAdam(adam, [&](AdamHandle& h) {
    MutexLock lock(&h.mu);
    if (h.pending == nullptr) {
      return Fail(TM_ERR_INVALID_ARGUMENT,
                  "tm_adam_step_groups_extend: no step is prepared (tm_adam_step_groups_prepare "
                  "first)");
    }
    auto inner = InnerGroups(h, kFunction, groups, count, /*extending=*/true);
    if (!inner.ok()) return Report(inner.status());
    const bool out_now = (flags & TM_ADAM_OUT_SCRATCH) != 0;
    return Report(
        WithContext(h.pending->Extend(grad_scale, *std::move(inner), out_now), kFunction));
  });
}

TM_API tm_status tm_adam_step_commit(tm_adam adam, size_t* buckets_done) {
  if (buckets_done != nullptr) *buckets_done = 0;
  return WithAdam(adam, [&](AdamHandle& h) {
    MutexLock lock(&h.mu);
    if (h.pending == nullptr) {
      return Fail(TM_ERR_INVALID_ARGUMENT,
                  "tm_adam_step_commit: no step is prepared (tm_adam_step_groups_prepare "
                  "first; a prepared step is committed or aborted once)");
    }
    BucketStepResult r = h.pending->Commit();
    h.pending.reset();
    h.pending_tensors.reset();
    if (buckets_done != nullptr) *buckets_done = r.buckets_done;
    return Report(WithContext(r.status, "tm_adam_step_commit"));
  });
}

TM_API tm_status tm_adam_step_abort(tm_adam adam) {
  return WithAdam(adam, [&](AdamHandle& h) {
    MutexLock lock(&h.mu);
    h.pending.reset();  // aborts it: every state and parameter as before
    h.pending_tensors.reset();
    return TM_OK;
  });
}

TM_API tm_status tm_optim_isa_get(tm_optim_isa* detected, tm_optim_isa* active) {
  if (detected != nullptr) *detected = static_cast<tm_optim_isa>(DetectedIsa());
  if (active != nullptr) *active = static_cast<tm_optim_isa>(ActiveIsa());
  return TM_OK;
}

TM_API tm_status tm_optim_set_isa_limit(tm_optim_isa limit, tm_optim_isa* active) {
  if (!ValidIsa(limit)) {
    return Fail(TM_ERR_INVALID_ARGUMENT,
                absl::StrFormat("tm_optim_set_isa_limit: limit = %d is not a tm_optim_isa",
                                static_cast<int>(limit)));
  }
  const Isa now = SetIsaLimit(static_cast<Isa>(limit));
  if (active != nullptr) *active = static_cast<tm_optim_isa>(now);
  return TM_OK;
}

}  // extern "C"
