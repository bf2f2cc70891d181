// The shared core: finding and claiming tensors, waiting for their landing copies, freeing
// copies (deferred while callers' work may use them), the failures kept for a sync.
#include "lib/runtime/core.h"

#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/handle.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

absl::StatusOr<Tensor*> Core::Find(uint64_t handle) {
  Tensor* t = tensors_.Find(handle);
  if (t == nullptr || t->orphaned) {  // orphaned: destroyed, its DLPack exports still out
    return Error(TM_ERR_INVALID_HANDLE,
                 absl::StrFormat("tensor handle 0x%016x is %s", handle,
                                 HandleMismatch(handle, HandleKind::kTensor,
                                                "zero, destroyed or of another runtime")
                                     .c_str()));
  }
  return t;
}

void Core::WaitLanded(Tensor& t) {
  if (!t.landing.has_value()) return;
  const io::CopyTicket ticket = *t.landing;
  const tm_tier tier = t.landing_tier;
  // A copy that has passed is only asked its outcome: no need to let the lock go.
  absl::Status s =
      ticket.fence->Passed()
          ? Retag(mover_->copy_engine().Wait(ticket), TM_ERR_DEVICE)
          : Unlocked(t, [&] { return Retag(mover_->copy_engine().Wait(ticket), TM_ERR_DEVICE); });
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

absl::StatusOr<Tensor*> Core::Claim(uint64_t handle, bool land) {
  bool waited = false;  // counted once (MoveWaits)
  for (;;) {
    auto t = Find(handle);  // again after every wait: it may have been destroyed meanwhile
    if (!t.ok()) return t.status();
    Tensor& tensor = **t;
    if (auto s = NotBusyByThisThread(tensor); !s.ok()) return s;
    if (tensor.busy()) {
      if (!waited) ++counters_.move_waits;
      waited = true;
      Wait(changed_);
      continue;
    }
    if (land && tensor.landing.has_value()) {
      WaitLanded(tensor);
      continue;
    }
    return &tensor;
  }
}

void Core::WaitWhileMoving(uint64_t handle) {
  bool waited = false;  // counted once (MoveWaits)
  for (;;) {
    const Tensor* t = tensors_.Find(handle);
    if (t == nullptr || !t->busy() || t->busy_by == std::this_thread::get_id()) return;
    if (!waited) ++counters_.move_waits;
    waited = true;
    Wait(changed_);
  }
}

absl::Status Core::NotBusyByThisThread(const Tensor& t) {
  if (t.busy_by != std::this_thread::get_id()) return absl::OkStatus();
  // Busy by this very thread, which is in a call out of the runtime (a recompute callback
  // rebuilding this tensor) and came back in with it: waiting would wait for itself.
  return Error(TM_ERR_BUSY,
               absl::StrFormat("tensor \"%s\" is being rebuilt by its recompute callback on this "
                               "thread: the callback may use other tensors, never its own (it "
                               "would wait for itself)",
                               t.name));
}

void Core::FreeCopy(Tensor& t, tm_tier tier) {
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

void Core::RecordFailure(const Tensor& t, absl::Status s) {
  ++counters_.moves_failed;
  // A copy that failed its checksum was the tensor's last valid one (a move reads another
  // copy when there is one): its bytes are gone, though nothing was moved.
  const bool lost = t.lost || ToTmStatus(s) == TM_ERR_CORRUPT;
  if (lost) ++counters_.moves_failed_lost;
  failures_.Record(t.handle, t.name, std::move(s), /*kept=*/!lost);
}

absl::Status Core::CheckOthersUnpinned(const Tensor& t, int keep) const {
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

absl::Status Core::CheckAboveUnpinned(const Tensor& t, tm_tier tier) const {
  for (int above = 0; above < tier; ++above) {
    if (t.copies[above].pins > 0) {
      return Error(TM_ERR_BUSY,
                   absl::StrFormat("cannot offload tensor \"%s\": it is acquired in %s", t.name,
                                   tm_tier_name(static_cast<tm_tier>(above))));
    }
  }
  return absl::OkStatus();
}

void Core::DropOthers(Tensor& t, tm_tier keep) {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep) FreeCopy(t, static_cast<tm_tier>(i));
  }
}

std::vector<io::FencePtr> Core::PendingUses(Tensor& t, tm_tier tier) {
  std::vector<io::FencePtr>& uses = t.copy(tier).uses;
  std::erase_if(uses, [](const io::FencePtr& f) { return f->Passed(); });
  return uses;
}

bool Core::ReapDeferred(tm_tier tier) { return deferred_.Reap(*tiers_, tier); }

void Core::SettleDeferred() {
  // The memory of dropped copies goes back once what used it has passed: waited for here, so
  // that after a sync the tiers' usage (and the framework's allocator) see it free.
  if (std::vector<io::FencePtr> fences = deferred_.Fences(); !fences.empty()) {
    Unlock();
    for (const io::FencePtr& f : fences) (void)f->Wait();
    Lock();
  }
  deferred_.ReapAll(*tiers_);
}

absl::Status Core::CheckNotHeld(const Tensor& t, absl::string_view what) {
  if (t.held_by_step == std::thread::id{}) return absl::OkStatus();
  if (t.hold_sealed) {
    return Error(TM_ERR_BUSY,
                 absl::StrFormat("tensor \"%s\" is the state of a prepared Adam step "
                                 "(tm_adam_step_groups_prepare) waiting for its commit or abort: "
                                 "cannot %s until then",
                                 t.name, what));
  }
  if (t.held_by_step == std::this_thread::get_id()) return absl::OkStatus();
  return Error(TM_ERR_BUSY,
               absl::StrFormat("tensor \"%s\" is the state of an Adam step running on another "
                               "thread: cannot %s until the step returns",
                               t.name, what));
}

}  // namespace tiermem
