// Tensors that exchange their contents: the commit of versions written aside. The CPU Adam steps
// a bucket's NVMe state into a shadow tensor and, once every bucket's new state is written,
// swaps each state with its shadow here, under one hold of the lock, so a step is all or nothing.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"

namespace tiermem {

namespace {

// Why the pair cannot swap now (empty: it can), or a refusal.
absl::Status CheckPair(const Tensor& a, const Tensor& b) {
  if (&a == &b) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("cannot swap tensor \"%s\" with itself", a.name));
  }
  if (a.bytes != b.bytes) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("cannot swap tensor \"%s\" (%u bytes) with \"%s\" (%u bytes): "
                                 "sizes differ",
                                 a.name, a.bytes, b.name, b.bytes));
  }
  for (const Tensor* t : {&a, &b}) {
    // Its bytes belong to its callback (and may be in no copy at all): swapping the copies
    // would hand them to the other tensor while the drop and the callback stay behind.
    if (t->recompute.fn != nullptr) {
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrFormat("cannot swap tensor \"%s\": it has a recompute callback "
                                   "(tm_tensor_set_recompute)",
                                   t->name));
    }
    if (t->landing.has_value()) {
      return Error(TM_ERR_BUSY, absl::StrFormat("cannot swap tensor \"%s\": a copy ordered on a "
                                                "caller's stream has not landed",
                                                t->name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Runtime::SwapContents(const std::vector<std::pair<uint64_t, uint64_t>>& pairs) {
  CoreLock lock(core_);
  std::vector<std::pair<Tensor*, Tensor*>> found;
  for (;;) {
    found.clear();
    bool moving = false, landed = false;
    for (const auto& [ha, hb] : pairs) {
      auto a = core_.Find(ha);
      if (!a.ok()) return a.status();
      auto b = core_.Find(hb);
      if (!b.ok()) return b.status();
      for (Tensor* t : {*a, *b}) {
        // tiermem's own copy down (an eviction's, vacate.cc), not a caller's: waited for here.
        if (t->landing.has_value() && t->landing_own && !t->busy()) {
          core_.WaitLanded(*t);
          landed = true;
        }
      }
      if (landed) break;  // the lock was released: look at every pair again
      if (absl::Status s = CheckPair(**a, **b); !s.ok()) return s;
      for (const Tensor* t : {*a, *b}) {
        if (absl::Status s = core_.CheckOthersUnpinned(*t, -1); !s.ok()) {
          return WithContext(s, "cannot swap contents");
        }
        moving = moving || t->busy() || t->queued > 0;
      }
      found.emplace_back(*a, *b);
    }
    if (landed) continue;
    if (!moving) break;
    core_.WaitForChange();  // a move finishing signals; then look again (a tensor may be gone)
  }
  for (auto [a, b] : found) {
    std::swap(a->copies, b->copies);
    for (int i = 0; i < TM_TIER_COUNT; ++i) {
      const auto tier = static_cast<tm_tier>(i);
      for (const Tensor* t : {a, b}) {
        if (!t->copy(tier).extent.empty())
          core_.tiers()->space(tier).Reown(t->copy(tier).extent, t->handle);
      }
    }
  }
  core_.NotifyChanged();
  return absl::OkStatus();
}

absl::Status Runtime::HoldForStep(uint64_t handle) {
  CoreLock lock(core_);
  auto t = core_.Find(handle);
  if (!t.ok()) return t.status();
  if (auto s = core_.CheckNotHeld(**t, "hold it for another step"); !s.ok()) return s;
  if (auto s = core_.CheckOthersUnpinned(**t, -1); !s.ok()) return s;
  (*t)->held_by_step = std::this_thread::get_id();
  return absl::OkStatus();
}

// From any thread: a step prepared in parts on a worker thread is committed or aborted on
// another (tm_adam_step_groups_extend), and a step unholds only what it held.
void Runtime::UnholdForStep(uint64_t handle) {
  CoreLock lock(core_);
  Tensor* t = core_.Lookup(handle);
  if (t != nullptr) {
    t->held_by_step = std::thread::id{};
    t->hold_sealed = false;
  }
}

void Runtime::SealForStep(uint64_t handle) {
  CoreLock lock(core_);
  Tensor* t = core_.Lookup(handle);
  if (t != nullptr && t->held_by_step == std::this_thread::get_id()) t->hold_sealed = true;
}

}  // namespace tiermem
