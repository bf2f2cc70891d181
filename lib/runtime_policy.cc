// The runtime's policies: room by eviction (Belady with a schedule, LRU without), prefetching
// along the schedule, steps, and placement of tensor classes.
#include "lib/runtime.h"

#include "absl/strings/str_format.h"
#include "lib/status.h"

namespace tiermem {

absl::StatusOr<Extent> Runtime::Allocate(Tensor& t, tm_tier tier, uint64_t horizon) {
  for (;;) {
    auto e = mover_->space(tier).Allocate(t.bytes, t.name);
    if (e.ok() || tier == TM_TIER_NVME || !absl::IsResourceExhausted(e.status())) return e;
    Tensor* victim = PickVictim(tier, &t, horizon);
    if (victim == nullptr) {
      return WithContext(e.status(),
                         horizon == kDemand
                             ? "nothing can be evicted (every copy there is acquired or moving)"
                             : "nothing needed later than it can be evicted for this prefetch");
    }
    if (auto s = Evict(*victim, tier); !s.ok()) {
      return WithContext(s, absl::StrFormat("evicting \"%s\" to make room", victim->name));
    }
  }
}

absl::Status Runtime::Reserve(Tensor& t, tm_tier tier) {
  TensorCopy& c = t.copy(tier);
  if (c.valid) return absl::OkStatus();
  t.busy = true;
  auto e = Allocate(t, tier, kDemand);
  t.busy = false;
  changed_.SignalAll();
  if (!e.ok()) return e.status();
  c.extent = *e;
  c.valid = true;
  return absl::OkStatus();
}

Tensor* Runtime::PickVictim(tm_tier tier, const Tensor* requester, uint64_t horizon) {
  const bool belady = schedule_.replaying();
  Tensor* best = nullptr;
  uint64_t best_next = 0;
  tensors_.ForEach([&](Tensor& v) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const TensorCopy& c = v.copy(tier);
    if (&v == requester || v.busy || !c.valid || c.pins > 0 || v.pending.has_value()) return;
    const uint64_t next = belady ? schedule_.NextUse(v.handle) : Schedule::kNever;
    if (horizon != kDemand && next <= horizon) return;  // needed before what we prefetch
    const bool better = best == nullptr || next > best_next ||
                        (next == best_next && v.last_use < best->last_use);
    if (better) {
      best = &v;
      best_next = next;
    }
  });
  return best;
}

absl::Status Runtime::Evict(Tensor& v, tm_tier tier) {
  const Trace::Clock::time_point start = Trace::Clock::now();
  const uint64_t bytes = v.bytes;
  if ((v.ResidencyMask() & ~TM_TIER_BIT(tier)) == 0) {
    // The only copy: write it one tier down first (which may evict there in turn).
    const tm_tier lower = static_cast<tm_tier>(tier + 1);
    if (auto s = MakeValid(v, lower); !s.ok()) return s;
    if (v.copy(tier).pins > 0) return absl::OkStatus();  // acquired meanwhile: look again
  }
  mover_->Drop(v, tier);
  ++counters_.evictions;
  counters_.eviction_bytes += bytes;
  trace_->Add(Trace::kEviction, v.name, start, Trace::Clock::now(), bytes);
  return absl::OkStatus();
}

void Runtime::IssuePrefetches() {
  const uint32_t depth = config_.prefetch_depth;
  if (depth == 0 || !schedule_.replaying()) return;
  // Stage 1: the next `depth` uses, up to the tier they are used in. Stage 2: the `depth` after
  // those, from NVMe to DRAM, so that stage 1 then only crosses the PCIe link.
  const auto upcoming = schedule_.Upcoming(2 * static_cast<size_t>(depth));
  for (size_t i = 0; i < upcoming.size(); ++i) {
    const auto& [position, use] = upcoming[i];
    Tensor* v = tensors_.Find(use.handle);
    if (!use.fill || v == nullptr || v->busy || v->queued > 0) continue;  // overwritten: no fill
    tm_tier target = use.tier;
    if (i >= depth) {
      if (!v->copy(TM_TIER_NVME).valid || v->copy(TM_TIER_DRAM).valid ||
          v->copy(TM_TIER_HBM).valid) {
        continue;
      }
      target = TM_TIER_DRAM;
    }
    if (v->copy(target).valid) continue;
    if (prefetch_in_flight_ > 0 && prefetch_in_flight_ + v->bytes > prefetch_limit_) break;
    prefetch_in_flight_ += v->bytes;
    ++v->queued;
    ++outstanding_;
    ++counters_.prefetches;
    jobs_.push_back(Job{use.handle, target, false, position, v->bytes});
    work_.Signal();
  }
}
tm_tier Runtime::HomeOf(tm_tensor_class cls) const {
  switch (config_.placement) {
    case Placement::kZeroOffload:
      return cls == TM_CLASS_OPTIMIZER_STATE ? TM_TIER_DRAM : TM_TIER_HBM;
    case Placement::kZeroInfinity:
      return cls == TM_CLASS_PARAM || cls == TM_CLASS_OPTIMIZER_STATE ? TM_TIER_NVME : TM_TIER_HBM;
    case Placement::kActivations:
      return cls == TM_CLASS_ACTIVATION ? TM_TIER_DRAM : TM_TIER_HBM;
    default:
      return TM_TIER_HBM;
  }
}

absl::Status Runtime::StepBegin() {
  MutexLock lock(&mu_);
  schedule_.BeginStep();
  IssuePrefetches();  // the step's first tensors, before its first acquire
  return absl::OkStatus();
}

absl::Status Runtime::StepEnd() {
  MutexLock lock(&mu_);
  if (!schedule_.in_step()) {
    return Error(TM_ERR_INVALID_ARGUMENT, "tm_step_end without tm_step_begin");
  }
  schedule_.EndStep();
  return absl::OkStatus();
}

absl::Status Runtime::SetSchedule(const std::vector<Schedule::Use>& uses) {
  MutexLock lock(&mu_);
  for (const auto& u : uses) {
    if (tensors_.Find(u.handle) == nullptr) {
      return Error(TM_ERR_INVALID_HANDLE,
                   absl::StrFormat("schedule entry 0x%016x is not a tensor of this runtime", u.handle));
    }
    if (u.tier != TM_TIER_HBM && u.tier != TM_TIER_DRAM) {
      return Error(TM_ERR_INVALID_ARGUMENT, "schedule tiers must be hbm or dram");
    }
  }
  schedule_.Set(uses);
  return absl::OkStatus();
}


}  // namespace tiermem
