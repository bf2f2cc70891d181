// The move protocol: claim a tensor, prepare a move under the lock, run it without the lock,
// commit its outcome to the copy states; copies freed (or deferred), checks on pins.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

absl::StatusOr<Tensor*> Runtime::Find(uint64_t handle) {
  Tensor* t = tensors_.Find(handle);
  if (t == nullptr) {
    return Error(
        TM_ERR_INVALID_HANDLE,
        absl::StrFormat("tensor handle 0x%016x is zero, destroyed or of another runtime", handle));
  }
  return t;
}

Tensor* Runtime::FindKey(uint64_t key) {
  auto it = keyed_.find(key);
  return it == keyed_.end() ? nullptr : tensors_.Find(it->second);
}

void Runtime::WaitLanded(Tensor& t) {
  if (!t.landing.has_value()) return;
  const io::CopyTicket ticket = *t.landing;
  const tm_tier tier = t.landing_tier;
  absl::Status s =
      Unlocked(t, [&] { return Retag(mover_->copy_engine().Wait(ticket), TM_ERR_DEVICE); });
  const bool replaces = t.landing_replaces;
  if (s.ok()) {
    t.Landed(tier);
    if (replaces) DropOthers(t, tier);
    return;
  }
  // The copy failed: that copy never became what it claimed. A copy_in's target is kept only
  // when it is the tensor's only copy (its other bytes are still there).
  if (!replaces || t.ResidencyMask() != TM_TIER_BIT(tier)) {
    FreeCopy(t, tier);
  } else {
    t.Landed(tier);
  }
  if (!t.materialized()) {
    // Its only copy failed to land: an eviction's copy down whose HBM memory was handed on
    // (vacate.cc). The bytes are lost; the tensor says so when next used.
    t.dropped = true;
    t.lost = true;
  }
  const std::string what =
      t.lost ? absl::StrFormat(
                   "copy down of tensor \"%s\" to %s, its HBM memory handed on (it is "
                   "lost)",
                   t.name, tm_tier_name(tier))
             : absl::StrFormat("stream-ordered copy of tensor \"%s\" to %s", t.name,
                               tm_tier_name(tier));
  RecordFailure(t, WithContext(s, what));
}

absl::StatusOr<Tensor*> Runtime::Claim(uint64_t handle, bool land) {
  bool waited = false;  // counted once (MoveWaits)
  for (;;) {
    auto t = Find(handle);  // again after every wait: it may have been destroyed meanwhile
    if (!t.ok()) return t.status();
    Tensor& tensor = **t;
    if (auto s = NotBusyByThisThread(tensor); !s.ok()) return s;
    if (tensor.busy()) {
      if (!waited) ++counters_.move_waits;
      waited = true;
      changed_.Wait(&mu_);
      continue;
    }
    if (land && tensor.landing.has_value()) {
      WaitLanded(tensor);
      continue;
    }
    return &tensor;
  }
}

void Runtime::WaitWhileMoving(uint64_t handle) {
  bool waited = false;  // counted once (MoveWaits)
  for (;;) {
    const Tensor* t = tensors_.Find(handle);
    if (t == nullptr || !t->busy() || t->busy_by == std::this_thread::get_id()) return;
    if (!waited) ++counters_.move_waits;
    waited = true;
    changed_.Wait(&mu_);
  }
}

absl::Status Runtime::NotBusyByThisThread(const Tensor& t) {
  if (t.busy_by != std::this_thread::get_id()) return absl::OkStatus();
  // Busy by this very thread, which is in a call out of the runtime (a recompute callback
  // rebuilding this tensor) and came back in with it: waiting would wait for itself.
  return Error(TM_ERR_BUSY,
               absl::StrFormat("tensor \"%s\" is being rebuilt by its recompute callback on this "
                               "thread: the callback may use other tensors, never its own (it "
                               "would wait for itself)",
                               t.name));
}

void Runtime::FreeCopy(Tensor& t, tm_tier tier) {
  std::vector<io::FencePtr> uses = PendingUses(t, tier);
  Extent e = t.Drop(tier);
  if (e.empty()) return;
  if (uses.empty()) {
    tiers_->space(tier).Free(e);
    return;
  }
  // Callers' work may still use the memory: it is freed once that work has passed.
  deferred_.Add(*tiers_, tier, e, std::move(uses));
}

void Runtime::RecordFailure(const Tensor& t, absl::Status s) {
  ++counters_.moves_failed;
  failures_.Record(t.handle, t.name, std::move(s));
}

absl::Status Runtime::MakeValid(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                                DropReason* why) {
  if (t.copy(dst).valid()) return absl::OkStatus();
  if (t.dropped) return Recompute(t, dst, caller, want, why);  // no copy to move: rebuilt
  if (int w = t.writing_tier(); w >= 0) {
    // Copying bytes that a writer is changing would make a torn copy look valid.
    if (why != nullptr) *why = DropReason::kSuperseded;
    return Error(TM_ERR_BUSY, absl::StrFormat("tensor \"%s\" is acquired for writing in %s", t.name,
                                              tm_tier_name(static_cast<tm_tier>(w))));
  }
  // Inclusive DRAM: a prefetch from NVMe to HBM reads through DRAM and keeps that copy.
  const bool read_through = dst == TM_TIER_HBM && ReadThroughDram(t, want);
  BusyScope busy(t, changed_);  // for the whole move: eviction below may release the lock too
  std::vector<RangeFence> behind;
  auto extent = Allocate(t, dst, want, why, nullptr, &behind);
  if (want.release_room) room_.Release(changed_);  // the room is made; the move needs no token
  if (!extent.ok()) return extent.status();

  MovePlan plan = PrepareMove(t, dst, *extent, caller);
  plan.behind = std::move(behind);
  const bool moves_behind = !plan.behind.empty();
  bool vacated = false;  // a copy down whose HBM memory was handed on as it ran
  OfferVacate(t, plan, want, &vacated);
  // A large scheduled prefetch up the link goes in the order of the uses (LinkOrder).
  const bool ordered = want.kind == Want::kPrefetch && dst == TM_TIER_HBM &&
                       plan.src == TM_TIER_DRAM && plan.stream == nullptr &&
                       plan.bytes >= LinkOrder::kMinBytes;
  // A large demand up the link: the ordered prefetches enqueued while it runs wait for it.
  const bool urgent = want.kind == Want::kDemand && dst == TM_TIER_HBM &&
                      plan.src == TM_TIER_DRAM && plan.bytes >= LinkOrder::kMinBytes;

  // Execute without the lock.
  std::optional<io::CopyTicket> pending;
  mu_.Unlock();
  bool left = false, registered = false;
  if (ordered) {
    for (io::FencePtr& f : link_order_.Enter(want.horizon)) plan.after.push_back(std::move(f));
    plan.on_enqueued = [this, &left](const io::FencePtr& fence) {
      link_order_.Leave(fence);
      left = true;
    };
  } else if (urgent) {
    link_order_.UrgentComing();
    plan.on_enqueued = [this, &registered](const io::FencePtr& fence) {
      link_order_.Urgent(fence);
      registered = true;
    };
  }
  const Trace::Clock::time_point start = Trace::Clock::now();
  absl::Status s = mover_->Execute(plan, &pending);
  if (ordered && !left) link_order_.Leave(nullptr);
  if (urgent && !registered) link_order_.Urgent(nullptr);
  if (trace_->enabled() && plan.src >= 0) TraceMove(t, plan, start, vacated);
  mu_.Lock();

  // Commit: the destination becomes valid only now; a failure frees it and leaves the rest.
  if (!s.ok()) {
    FreeCopy(t, dst);
    if (vacated && !t.materialized()) {
      // Its HBM memory was handed on before the device failed the copy (see vacate.cc).
      t.dropped = true;
      t.lost = true;
      s = WithContext(s, absl::StrFormat("tensor \"%s\" is lost: its HBM memory was handed on "
                                         "while the copy down ran",
                                         t.name));
    }
    return WithContext(s, absl::StrFormat("moving tensor \"%s\" (%s) to %s", t.name,
                                          HumanBytes(t.bytes), tm_tier_name(dst)));
  }
  t.EndFill(dst);
  if (moves_behind) {
    ++counters_.moves_behind;
    counters_.moves_behind_bytes += t.bytes;
  }
  if (pending.has_value()) t.Land(dst, *pending, /*replaces=*/false, /*own=*/vacated);
  if (dst == TM_TIER_HBM) NoteCleanRead(t, plan.src, t.bytes, start);
  // Kept: its next read saves one of NVMe (this one did not; it read NVMe to make the copy).
  if (read_through && t.copy(TM_TIER_DRAM).valid()) t.copy(TM_TIER_DRAM).kept_clean = true;
  return absl::OkStatus();
}

void Runtime::TraceMove(const Tensor& t, const MovePlan& plan, Trace::Clock::time_point start,
                        bool vacated) {
  static constexpr Trace::Track kTrack[TM_TIER_COUNT][TM_TIER_COUNT] = {
      {Trace::kAcquire, Trace::kDeviceToHost, Trace::kHbmToNvme},
      {Trace::kHostToDevice, Trace::kAcquire, Trace::kNvmeWrite},
      {Trace::kNvmeToHbm, Trace::kNvmeRead, Trace::kAcquire}};
  const Trace::Track track = kTrack[plan.src][plan.dst];
  if (!plan.behind.empty()) {
    uint64_t behind = 0;
    for (const RangeFence& r : plan.behind) behind += r.size;
    trace_->Add(track, t.name, start, Trace::Clock::now(), plan.bytes,
                absl::StrFormat("written behind copies down still reading %s of its memory",
                                HumanBytes(behind)));
  } else if (vacated) {
    trace_->Add(track, t.name, start, Trace::Clock::now(), plan.bytes,
                plan.lands ? "its hbm memory handed on once enqueued; lands (not waited for)"
                           : "its hbm memory handed on once enqueued");
  } else {
    trace_->Add(track, t.name, start, Trace::Clock::now(), plan.bytes);
  }
}

MovePlan Runtime::PrepareMove(Tensor& t, tm_tier dst, const Extent& extent,
                              const CallerStream& caller) {
  // Prepare: the nearest valid copy is the source (on a tie, the faster tier).
  MovePlan plan;
  plan.dst = dst;
  plan.bytes = t.bytes;
  plan.stream = caller.stream;
  if (caller.fence != nullptr) plan.after.push_back(caller.fence);
  if (t.materialized()) {
    for (int d = 1; d < TM_TIER_COUNT && plan.src < 0; ++d) {
      for (int cand : {static_cast<int>(dst) - d, static_cast<int>(dst) + d}) {
        if (cand >= 0 && cand < TM_TIER_COUNT && t.copies[cand].valid()) {
          plan.src = cand;
          break;
        }
      }
    }
    const tm_tier src = static_cast<tm_tier>(plan.src);
    for (io::FencePtr& f : PendingUses(t, src)) plan.after.push_back(std::move(f));
    plan.src_extent = t.copy(src).extent;
    if (src != TM_TIER_NVME) plan.src_addr = tiers_->Address(src, plan.src_extent);
  }
  t.BeginFill(dst, extent);
  plan.dst_extent = extent;
  if (dst != TM_TIER_NVME) plan.dst_addr = tiers_->Address(dst, extent);
  return plan;
}

absl::Status Runtime::CheckOthersUnpinned(const Tensor& t, int keep) const {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep && t.copies[i].pins > 0) {
      return Error(
          TM_ERR_BUSY,
          absl::StrFormat("tensor \"%s\" is acquired in %s (%u outstanding acquire(s))", t.name,
                          tm_tier_name(static_cast<tm_tier>(i)), t.copies[i].pins));
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::CheckAboveUnpinned(const Tensor& t, tm_tier tier) const {
  for (int above = 0; above < tier; ++above) {
    if (t.copies[above].pins > 0) {
      return Error(TM_ERR_BUSY,
                   absl::StrFormat("cannot offload tensor \"%s\": it is acquired in %s", t.name,
                                   tm_tier_name(static_cast<tm_tier>(above))));
    }
  }
  return absl::OkStatus();
}

void Runtime::DropOthers(Tensor& t, tm_tier keep) {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep) FreeCopy(t, static_cast<tm_tier>(i));
  }
}

absl::Status Runtime::Reserve(Tensor& t, tm_tier tier, bool* made_room) {
  if (t.copy(tier).valid()) return absl::OkStatus();
  BusyScope busy(t, changed_);
  std::vector<RangeFence> behind;
  auto e = Allocate(t, tier, Want{}, nullptr, made_room, &behind);
  if (!e.ok()) return e.status();
  t.BeginFill(tier, *e);
  // Memory a copy down still reads: the caller's writes wait for it as for a caller's use (on
  // its stream, or the host before the pointer is handed out).
  for (RangeFence& r : behind) t.copy(tier).uses.push_back(std::move(r.fence));
  return absl::OkStatus();
}

absl::Status Runtime::OffloadClaimed(Tensor& t, tm_tier tier) {
  if (!t.materialized()) return absl::OkStatus();  // zeros need no space anywhere
  if (auto s = CheckAboveUnpinned(t, tier); !s.ok()) return s;
  // Inclusive DRAM: with a DRAM copy valid, the move below writes NVMe from it (the nearest).
  // Counted as a write-through only when it writes: NVMe may hold the bytes already.
  const bool writes = !t.copy(tier).valid();
  bool made = false;
  const bool keep_dram = tier == TM_TIER_NVME && KeepCleanDramCopy(t, &made);
  // DRAM holds the bytes now: HBM's copy is freed before the NVMe write rather than after it,
  // so that the prefetches and demands waiting for HBM room get it a write's time sooner. A
  // failed write then leaves the tensor valid in DRAM. (Unless an acquire in HBM waits for
  // this offload: that copy stays, below.)
  if (keep_dram && t.copy(TM_TIER_DRAM).valid() && t.copy(TM_TIER_HBM).valid() &&
      !wanted_in_hbm_.contains(t.handle)) {
    FreeCopy(t, TM_TIER_HBM);
    IssuePrefetches();
    changed_.SignalAll();
  }
  Want want = Demand();
  want.vacates = tier == TM_TIER_DRAM;  // HBM's copy goes once DRAM has it: hand it on
  if (auto s = MakeValid(t, tier, {}, want); !s.ok()) {
    // The clean copy made for it goes, unless it holds the bytes now: HBM's copy was freed
    // (above, or handed on as the copy down ran).
    if (made && t.copy(TM_TIER_HBM).valid() && t.copy(TM_TIER_DRAM).state == CopyState::kValid) {
      FreeCopy(t, TM_TIER_DRAM);
    }
    return s;
  }
  // An acquire in HBM has waited for this offload: NVMe holds the bytes now, so HBM's copy is
  // clean and stays for it, rather than being freed and brought straight back up.
  const bool keep_hbm =
      tier == TM_TIER_NVME && wanted_in_hbm_.contains(t.handle) && t.copy(TM_TIER_HBM).valid();
  for (int above = 0; above < tier; ++above) {
    if (keep_dram && above == TM_TIER_DRAM) continue;  // clean now: NVMe holds its bytes
    if (keep_hbm && above == TM_TIER_HBM) continue;
    FreeCopy(t, static_cast<tm_tier>(above));
  }
  if (keep_dram && t.copy(TM_TIER_DRAM).valid()) {
    t.copy(TM_TIER_DRAM).kept_clean = true;
    if (writes) {
      ++counters_.write_throughs;
      counters_.write_through_bytes += t.bytes;
    }
  }
  return absl::OkStatus();
}

std::vector<io::FencePtr> Runtime::PendingUses(Tensor& t, tm_tier tier) {
  std::vector<io::FencePtr>& uses = t.copy(tier).uses;
  std::erase_if(uses, [](const io::FencePtr& f) { return f->Passed(); });
  return uses;
}

bool Runtime::ReapDeferred(tm_tier tier) { return deferred_.Reap(*tiers_, tier); }

void Runtime::SettleDeferred() {
  // The memory of dropped copies goes back once what used it has passed: waited for here, so
  // that after a sync the tiers' usage (and the framework's allocator) see it free.
  if (std::vector<io::FencePtr> fences = deferred_.Fences(); !fences.empty()) {
    mu_.Unlock();
    for (const io::FencePtr& f : fences) (void)f->Wait();
    mu_.Lock();
  }
  deferred_.ReapAll(*tiers_);
}

}  // namespace tiermem
