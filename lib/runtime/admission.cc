// Admission of a scheduled prefetch, do no harm (Cao, Felten, Karlin, Li 1995): the uses before
// the one a prefetch serves keep their room, in bytes and, in a slab, in holes.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

// The error of a prefetch (or hint) dropped for want of room: a hint, counted, never reported.
absl::Status DroppedPrefetch(const Tensor& t, tm_tier tier, DropReason reason,
                             absl::string_view message, DropReason* why) {
  if (why != nullptr) *why = reason;
  return Error(TM_ERR_OUT_OF_MEMORY, absl::StrFormat("prefetch of tensor \"%s\" to %s dropped: %s",
                                                     t.name, tm_tier_name(tier), message));
}

absl::Status Room::AdmitPrefetch(Tensor& t, tm_tier tier, Want want, uint64_t need,
                                 DropReason* why) {
  // Do no harm (Cao, Felten, Karlin, Li 1995): a scheduled prefetch takes only room that no
  // use before the one it serves needs, whether that use fills (a read) or not (a write
  // acquire, a fresh tensor). Room is free bytes plus the copies it may evict.
  if (want.kind != Want::kPrefetch || tier == TM_TIER_NVME) return absl::OkStatus();
  const std::vector<std::pair<uint64_t, uint64_t>> needed = NeededBefore(t, tier, want.horizon);
  if (needed.empty()) return absl::OkStatus();
  uint64_t before = 0;
  for (const auto& [position, bytes] : needed) before += bytes;
  const EvictionPlan plan = PlanEviction(t, tier, want, need);
  // Each earlier use in turn: the room left after this prefetch, plus the copies held now that
  // the recorded step lets go before that use (a parameter released at its layer's end makes
  // the room of the next layer's fresh activation), less what the uses so far took.
  bool fits = plan.reclaimable >= need;
  if (fits && plan.reclaimable - need < before) {
    const std::vector<std::pair<uint64_t, uint64_t>> released =
        ReleasedBefore(t, tier, want.horizon);
    uint64_t room = plan.reclaimable - need;
    size_t r = 0;
    for (const auto& [position, bytes] : needed) {
      for (; r < released.size() && released[r].first <= position; ++r) room += released[r].second;
      if (room < bytes) {
        fits = false;
        break;
      }
      room -= bytes;
    }
  }
  if (!fits) {
    return DroppedPrefetch(
        t, tier, DropReason::kNoRoom,
        absl::StrFormat("the %s that earlier uses need leave no room for it", HumanBytes(before)),
        why);
  }
  return absl::OkStatus();
}

std::vector<std::pair<uint64_t, uint64_t>> Room::NeededBefore(const Tensor& t, tm_tier tier,
                                                              uint64_t horizon) {
  std::vector<std::pair<uint64_t, uint64_t>> needed;
  absl::flat_hash_map<uint64_t, bool> seen;
  TierSpace& space = core_.tiers()->space(tier);
  prefetcher_.schedule().ForEachBefore(
      horizon, [&](uint64_t position, const Schedule::Use& use) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (use.tier != tier || use.key == t.key || !seen.emplace(use.key, true).second) return;
        const Tensor* v = prefetcher_.FindKey(use.key);
        // A use whose tensor is not created yet (a fresh activation) needs its room all the same.
        if (v != nullptr && v->copies[tier].state != CopyState::kAbsent) return;
        needed.emplace_back(position, space.Rounded(v != nullptr ? v->bytes : use.bytes));
      });
  return needed;
}

std::optional<uint64_t> Room::LetGoBefore(const Tensor& v, const Tensor& t, tm_tier tier,
                                          uint64_t horizon) {
  if (&v == &t || prefetcher_.FindKey(v.key) != &v || v.busy()) return std::nullopt;
  const TensorCopy& c = v.copies[tier];
  // Held by its caller now, valid, and another tier holds its bytes: once let go, a demand
  // drops it without writing anything.
  if (c.pins == 0 || c.state != CopyState::kValid || v.only_copy(tier)) return std::nullopt;
  if (prefetcher_.schedule().NextUse(v.key) <= horizon)
    return std::nullopt;  // used again first: it stays
  const uint64_t by = prefetcher_.schedule().ReleasedBy(v.key);
  if (by >= horizon) return std::nullopt;
  return by;
}

std::vector<std::pair<uint64_t, uint64_t>> Room::ReleasedBefore(const Tensor& t, tm_tier tier,
                                                                uint64_t horizon) {
  std::vector<std::pair<uint64_t, uint64_t>> released;
  for (const TierSpace::Block& b : core_.tiers()->space(tier).Layout()) {
    const Tensor* v = b.free ? nullptr : core_.Lookup(b.owner);
    if (v == nullptr) continue;
    if (const std::optional<uint64_t> by = LetGoBefore(*v, t, tier, horizon)) {
      released.emplace_back(*by, b.size);
    }
  }
  std::sort(released.begin(), released.end());
  return released;
}

Room::Placed Room::WindowPlaced(const EvictionPlan& plan, uint64_t need) {
  // The hole also takes in the free blocks on either side of the window.
  size_t first = plan.window->first, last = plan.window->last;
  auto free = [&](size_t i) { return plan.slots[i].kind == EvictionSlot::Kind::kFree; };
  while (first > 0 && free(first - 1)) --first;
  while (last + 1 < plan.slots.size() && free(last + 1)) ++last;
  return Placed{plan.offsets[first], plan.offsets[last] + plan.slots[last].size, need};
}

bool Room::LeavesHoles(const Tensor& t, tm_tier tier, Want want, std::optional<Placed> placed) {
  // Bytes are not holes: a slab may have the bytes an earlier use needs only in pieces once the
  // prefetch sits in the largest of them. That use (a fresh activation's write, above all) would
  // then wait for a move in flight to free a hole while the prefetch, needed later, is on time.
  const std::vector<std::pair<uint64_t, uint64_t>> needed = NeededBefore(t, tier, want.horizon);
  if (needed.empty()) return true;
  // One look at the layout serves every use (in a slab the slots do not depend on the bytes
  // asked); t's new extent is a wall. Walls the step lets go before a use are free for it.
  const EvictionPlan plan = PlanEviction(t, tier, want, needed.front().second);
  std::vector<uint64_t> let_go(plan.slots.size(), Schedule::kNever);
  for (size_t i = 0; i < plan.slots.size(); ++i) {
    if (plan.slots[i].kind != EvictionSlot::Kind::kWall || plan.owners[i] == 0) continue;
    if (const Tensor* v = core_.Lookup(plan.owners[i]); v != nullptr) {
      let_go[i] = LetGoBefore(*v, t, tier, want.horizon).value_or(Schedule::kNever);
    }
  }
  auto holes = [&](const std::vector<EvictionSlot>& layout, const std::vector<uint64_t>& go) {
    for (const auto& [position, bytes] : needed) {
      std::vector<EvictionSlot> slots = layout;
      for (size_t i = 0; i < slots.size(); ++i) {
        if (go[i] <= position) slots[i].kind = EvictionSlot::Kind::kFree;
      }
      if (!CheapestWindow(slots, bytes).has_value()) return false;
    }
    return true;
  };
  if (!placed.has_value()) return holes(plan.slots, let_go);
  // Before the window [placed->begin, placed->end) is evicted for t: t would take `bytes` of
  // the hole it leaves, at one end or the other; either will do.
  for (const bool low : {true, false}) {
    std::vector<EvictionSlot> slots;
    std::vector<uint64_t> go;
    bool inside = false;
    for (size_t i = 0; i < plan.slots.size(); ++i) {
      const uint64_t begin = plan.offsets[i], end = begin + plan.slots[i].size;
      if (end <= placed->begin || begin >= placed->end) {
        slots.push_back(plan.slots[i]);
        go.push_back(let_go[i]);
        continue;
      }
      // The layout changed since the window was chosen (a deferred extent was freed): no
      // judgement before, the check after the allocation still holds.
      if (begin < placed->begin || end > placed->end) return true;
      if (inside) continue;
      inside = true;
      EvictionSlot mine{placed->bytes, EvictionSlot::Kind::kWall};
      EvictionSlot rest{placed->end - placed->begin - placed->bytes, EvictionSlot::Kind::kFree};
      slots.push_back(low ? mine : rest);
      slots.push_back(low ? rest : mine);
      go.insert(go.end(), 2, Schedule::kNever);
    }
    if (holes(slots, go)) return true;
  }
  return false;
}

}  // namespace tiermem
