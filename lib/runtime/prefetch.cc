// Prefetching along the schedule: uses noted, prefetches issued ahead within the depth and
// byte limits, steps, explicit schedules, schedule keys and the home tier of each class.
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

void Prefetcher::NoteUse(Tensor& t, tm_tier tier, bool fill, std::vector<Start>* starts) {
  t.last_use = ++tick_;
  schedule_.OnUse(t.key, tier, fill, t.bytes);
  // Small tensors' window ahead is refilled every depth / 2 uses, not at each: a refill that
  // queues work wakes a mover, and on the caller's thread (this is its acquire) that wake-up
  // costs more than the copy of a small tensor. A use's prefetch is then queued depth / 2 + 1 to
  // depth uses ahead. Where the last refill queued nothing, or a large tensor (its copy, not the
  // wake-up, is what the lead must hide), or left something for later (a tensor not made yet, still
  // landing, or held back by the bytes in flight, as at the turn from forward to backward), each
  // use looks again.
  if (uses_to_refill_ > 0) {
    --uses_to_refill_;
    return;
  }
  const Refill r = IssuePrefetches(starts);
  uses_to_refill_ = r.whole && r.largest > 0 && r.largest <= kBatchedRefillBytes
                        ? std::max<uint32_t>(1, core_.config().prefetch_depth / 2) - 1
                        : 0;
}

Prefetcher::Refill Prefetcher::IssuePrefetches(std::vector<Start>* starts) {
  const uint32_t depth = core_.config().prefetch_depth;
  if (depth == 0 || !schedule_.replaying()) return {};
  // Stage 1: the next `depth` uses, up to the tier they are used in. Stage 2: the `depth` after
  // those, from NVMe to DRAM, so that stage 1 then only crosses the PCIe link. Room is checked
  // when a prefetch runs (do no harm), not here: by then the picture has changed.
  const auto upcoming = schedule_.Upcoming(2 * static_cast<size_t>(depth));
  Refill r;
  bool queued = false;  // a job pushed for the movers
  for (size_t i = 0; i < upcoming.size(); ++i) {
    const auto& [position, use] = upcoming[i];
    if (!use.fill || use.tier == TM_TIER_NVME) continue;  // overwritten, or nothing to bring
    Tensor* v = FindKey(use.key);
    if (v == nullptr || v->busy()) {
      r.whole = false;
      continue;
    }
    if (v->queued > 0 && UsedSoon(*v)) CancelQueuedOffloads(*v);
    if (v->queued > 0) continue;  // a move of it runs, or a job waits: its order is kept
    tm_tier target = use.tier;
    if (i >= depth) {
      if (!v->copy(TM_TIER_NVME).valid() || v->copy(TM_TIER_DRAM).valid() ||
          v->copy(TM_TIER_HBM).valid()) {
        continue;
      }
      target = TM_TIER_DRAM;
    }
    if (v->copy(target).valid()) continue;
    if (!v->materialized()) {
      r.whole = false;
      continue;
    }
    const uint64_t in_flight = jobs_.PrefetchBytesInFlight();
    if (in_flight > 0 && in_flight + v->bytes > prefetch_limit_) {
      r.whole = false;
      break;
    }
    ++counters_.prefetches;
    r.largest = std::max(r.largest, v->bytes);
    if (starts != nullptr && target == TM_TIER_HBM && v->bytes <= kBatchedRefillBytes &&
        v->copy(TM_TIER_DRAM).valid() && !v->landing.has_value()) {
      starts->push_back(Start{v->handle, position});
      continue;
    }
    ++v->queued;
    jobs_.Push(Job{v->handle, target, JobKind::kPrefetch, position, v->bytes});
    queued = true;
  }
  // One mover is woken, whatever the number queued: it wakes another when it finds more work
  // than its own (MoverLoop), so that the caller's thread, which issues these in its acquire,
  // pays for one wake-up at most.
  if (queued) jobs_.Wake();
  return r;
}

void Prefetcher::Queue(const Start& s) {
  Tensor* v = core_.Lookup(s.handle);
  if (v == nullptr) return;
  ++v->queued;
  jobs_.Push(Job{v->handle, TM_TIER_HBM, JobKind::kPrefetch, s.horizon, v->bytes});
  jobs_.Wake();
}

bool Prefetcher::UsedSoon(const Tensor& t) {
  const uint32_t depth = core_.config().prefetch_depth;
  if (depth == 0 || !schedule_.replaying() || FindKey(t.key) != &t) return false;
  // Used within the prefetch stages, and the tier of that use can hold it until then beside
  // everything used before it (each tensor counted once): then a write down now would only be
  // read back. When they do not all fit, something must leave before that use, and the copy
  // used last among them (this one) is the one to go (Belady): its offload runs. Keeping it
  // would make a demand evict a copy needed sooner.
  absl::flat_hash_map<std::pair<uint64_t, int>, bool> seen;
  uint64_t working_set[TM_TIER_NVME] = {};  // by tier of use: HBM, DRAM
  for (const auto& [position, use] : schedule_.Upcoming(2 * static_cast<size_t>(depth))) {
    if (use.tier == TM_TIER_NVME || !seen.emplace(std::pair{use.key, use.tier}, true).second) {
      continue;
    }
    const Tensor* v = FindKey(use.key);
    const TierSpace& space = core_.tiers()->space(use.tier);
    working_set[use.tier] += space.Rounded(v != nullptr ? v->bytes : use.bytes);
    if (use.key != t.key) continue;
    if (!use.fill) return false;  // overwritten first: its bytes are not needed
    return working_set[use.tier] <= space.capacity();
  }
  return false;
}

void Prefetcher::CancelQueuedOffloads(Tensor& t) {
  // Used within twice the prefetch depth (the stages above): a write down not even started
  // by now would be read back at once, crossing both links, and its prefetch would wait
  // behind the write. The coming use supersedes the
  // offload, as an acquire does one that has not run yet (RunJob). Running ones finish.
  const uint64_t cancelled = jobs_.CancelQueuedOffloads(t.handle);
  if (cancelled == 0) return;
  t.queued -= static_cast<uint32_t>(cancelled);
  core_.NotifyChanged();  // Sync may be waiting for these
}

tm_tier Prefetcher::HomeOf(tm_tensor_class cls) const {
  switch (core_.config().placement) {
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

uint64_t Prefetcher::Register(const TensorDesc& desc, uint64_t handle) {
  uint64_t key;
  if (!desc.name.empty()) {
    key = absl::Hash<std::pair<int, std::string>>{}({1, desc.name});
  } else if (schedule_.in_step()) {
    key = absl::Hash<std::tuple<int, uint64_t, uint64_t>>{}({2, created_in_step_++, desc.bytes});
  } else {
    key = absl::Hash<std::pair<int, uint64_t>>{}({3, handle});
  }
  keyed_[key] = handle;
  return key;
}

void Prefetcher::Forget(uint64_t key, uint64_t handle) {
  if (auto it = keyed_.find(key); it != keyed_.end() && it->second == handle) keyed_.erase(it);
}

void Prefetcher::NoteRelease(const Tensor& t) {
  if (FindKey(t.key) == &t) schedule_.OnRelease(t.key);
}

void Prefetcher::NoteOrphanRelease(const Tensor& t) {
  if (!keyed_.contains(t.key)) schedule_.OnRelease(t.key);
}

void Prefetcher::BeginStep() {
  schedule_.BeginStep();
  created_in_step_ = 0;
  uses_to_refill_ = 0;  // the step's first use looks ahead
  IssuePrefetches();    // the step's first tensors, before its first acquire
}

bool Prefetcher::EndStep() {
  if (!schedule_.in_step()) return false;
  schedule_.EndStep();
  return true;
}

void Prefetcher::SetSchedule(std::vector<Schedule::Use> uses) { schedule_.Set(std::move(uses)); }

void Prefetcher::FillStats(tm_stats& s) const {
  s.schedule_length = schedule_.size();
  s.schedule_relearned = schedule_.relearned();
}

absl::Status Runtime::StepBegin() {
  CoreLock lock(core_);
  prefetcher_.BeginStep();
  return absl::OkStatus();
}

absl::Status Runtime::StepEnd() {
  CoreLock lock(core_);
  if (!prefetcher_.EndStep()) {
    return Error(TM_ERR_INVALID_ARGUMENT, "tm_step_end without tm_step_begin");
  }
  // The failures kept so far, without waiting for moves in flight: a framework calls this
  // anyway, so a failed offload does not wait for a sync nobody calls. Callers' copies that are
  // done are reaped too, and deferred frees whose streams have passed.
  copies_.ReapCallerCopies(0, false);
  core_.ReapAllDeferred();
  return core_.TakeFailure(0);
}

absl::Status Runtime::SetSchedule(const std::vector<ScheduledUse>& uses) {
  CoreLock lock(core_);
  std::vector<Schedule::Use> keyed;
  keyed.reserve(uses.size());
  for (const auto& u : uses) {
    const Tensor* t = core_.Lookup(u.handle);
    if (t == nullptr) {
      return Error(
          TM_ERR_INVALID_HANDLE,
          absl::StrFormat("schedule entry 0x%016x is not a tensor of this runtime", u.handle));
    }
    if (u.tier != TM_TIER_HBM && u.tier != TM_TIER_DRAM) {
      return Error(TM_ERR_INVALID_ARGUMENT, "schedule tiers must be hbm or dram");
    }
    keyed.push_back(Schedule::Use{t->key, u.tier, true, t->bytes});
  }
  prefetcher_.SetSchedule(std::move(keyed));
  return absl::OkStatus();
}

Tensor* Prefetcher::FindKey(uint64_t key) {
  auto it = keyed_.find(key);
  return it == keyed_.end() ? nullptr : core_.Lookup(it->second);
}

}  // namespace tiermem
