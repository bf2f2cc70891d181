// Room in a tier: admission (do no harm), the cheapest window of copies evicted, demands waiting
// for moves in flight, and the error of a request beyond help.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

Room::EvictionPlan Room::PlanEviction(const Tensor& t, tm_tier tier, Want want, uint64_t need) {
  EvictionPlan plan;
  // Extents waiting for callers' work to pass are walls that will fall: a demand waits for them.
  plan.in_flight = core_.ReapDeferred(tier);
  const bool belady = prefetcher_.schedule().replaying();
  const uint64_t now = prefetcher_.schedule().now();
  const std::vector<TierSpace::Block> layout = core_.tiers()->space(tier).Layout();
  const uint64_t horizon = belady ? prefetcher_.schedule().size() : layout.size();
  // A demand waits for what eviction writes: clean drops first (see CheapestWindow).
  const bool clean_first = want.kind == Want::kDemand;
  for (const TierSpace::Block& b : layout) {
    EvictionSlot slot;
    slot.size = b.size;
    plan.owners.push_back(b.owner);
    plan.offsets.push_back(b.offset);
    // Memory a copy down is leaving (vacate.cc) is room: MakeRoom takes it when nothing else fits.
    if (b.free || (b.owner == 0 && core_.HandedOnAt(tier, b.offset))) {
      plan.free_bytes += b.size;
      plan.reclaimable += b.size;
      plan.slots.push_back(slot);
      continue;
    }
    slot.kind = EvictionSlot::Kind::kWall;
    Tensor* v = core_.Lookup(b.owner);
    if (v == nullptr || v == &t) {
      plan.slots.push_back(slot);
      continue;
    }
    const TensorCopy& c = v->copies[tier];
    if (c.pins > 0 || c.state == CopyState::kWriting) {
      plan.pinned.emplace_back(v->name, b.size);
    } else if (v->busy() && v->busy_by != std::this_thread::get_id()) {
      plan.in_flight = true;  // another thread moves it: done soon, then maybe evictable
    } else if (v->busy() || c.state == CopyState::kFilling) {
      // Busy by this thread: a tensor of the chain that asked for this room.
    } else if (!c.uses.empty() && !core_.PendingUses(*v, tier).empty()) {
      // Callers' streams may still use its memory: evictable once their work passes (a demand
      // waits for that, polling; nothing waits on the host for a caller's stream here).
      plan.in_flight = true;
    } else if (c.state == CopyState::kLanding && want.kind != Want::kDemand) {
      // Evicting it means waiting for its stream-ordered copy: only a demand waits.
    } else {
      uint64_t next = Schedule::kNever;
      if (belady && prefetcher_.FindKey(v->key) == v) next = prefetcher_.schedule().NextUse(v->key);
      if (want.kind == Want::kPrefetch && next <= want.horizon) {
        // Do no harm: never evict a copy used before the use this prefetch serves.
      } else {
        const uint64_t distance = belady ? (next == Schedule::kNever ? kNoNextUse : next - now)
                                         : prefetcher_.tick() - v->last_use;
        slot.kind = EvictionSlot::Kind::kEvictable;
        slot.dirty = v->only_copy(tier) && !recompute_.DropsForRecompute(*v, tier);
        slot.cost = EvictionCost(b.size, slot.dirty, distance, horizon);
        plan.reclaimable += b.size;
      }
    }
    plan.slots.push_back(slot);
  }
  if (core_.tiers()->space(tier).counted()) {
    // HBM from the framework's allocator: no adjacency to keep, any victims whose bytes suffice
    // make room. Taken in CountedOrder, the cheapest of them form a window.
    std::vector<EvictionSlot> slots;
    std::vector<uint64_t> owners, offsets;
    for (size_t i : CountedOrder(plan.slots, clean_first)) {
      slots.push_back(plan.slots[i]);
      owners.push_back(plan.owners[i]);
      offsets.push_back(plan.offsets[i]);
    }
    plan.slots = std::move(slots);
    plan.owners = std::move(owners);
    plan.offsets = std::move(offsets);
  }
  plan.window = CheapestWindow(plan.slots, need, clean_first);
  return plan;
}

uint64_t Room::FreesAfter(uint64_t owner, tm_tier tier) {
  // Placement (TierSpace::Allocate): how soon a neighbour's memory is free again. A deferred
  // free goes first; then copies eviction may take, the one used furthest ahead first (as
  // eviction picks them); then copies in use now, free once released; last, copies on their
  // way in for a use ahead, the later that use the later they free. Eviction's window then
  // finds the leftover of a hole and its neighbour's bytes side by side, and copies that arrive
  // for the coming uses pack together away from the ones in use.
  constexpr uint64_t kEvictable = uint64_t{1} << 61, kInUse = uint64_t{2} << 61;
  const Tensor* v = owner == 0 ? nullptr : core_.Lookup(owner);
  if (v == nullptr) return 0;
  const TensorCopy& c = v->copies[tier];
  const bool scheduled = prefetcher_.schedule().replaying() && prefetcher_.FindKey(v->key) == v;
  const uint64_t next = scheduled ? prefetcher_.schedule().NextUse(v->key) : Schedule::kNever;
  const uint64_t ahead = std::min(
      next == Schedule::kNever ? kEvictable : next - prefetcher_.schedule().now(), kEvictable - 1);
  if (c.pins > 0) return kInUse;
  if (v->busy() || c.state != CopyState::kValid) return kInUse + 1 + ahead;
  // As eviction ranks it: positions to the next use when replaying, else the time unused.
  const uint64_t distance = prefetcher_.schedule().replaying()
                                ? ahead
                                : std::min(prefetcher_.tick() - v->last_use, ahead);
  return kEvictable - distance;
}

namespace {

// Whether a window evicts a copy with a next use: EvictionCost weighs only those above their
// bytes (x2 when dirty).
bool UsedAgain(const EvictionWindow& w) {
  return w.cost > 1.001 * static_cast<double>(w.evicted_bytes + w.dirty_bytes);
}

constexpr absl::string_view kLeavesNoHole =
    "in the slab it would leave an earlier use no hole of its size";

}  // namespace

std::string Room::ChunkRounding(tm_tier tier, uint64_t bytes) {
  // The framework's allocator is counted too, with a granule of 256: only mapped chunks count.
  if (tier != TM_TIER_HBM || core_.config().hbm_layout != HbmLayout::kMapped ||
      core_.config().device_allocator.set()) {
    return "";
  }
  const uint64_t chunk = core_.tiers()->space(tier).granule();
  const uint64_t rounded = bytes > UINT64_MAX - chunk ? bytes : (bytes + chunk - 1) / chunk * chunk;
  if (rounded == bytes) {
    return absl::StrFormat(" (TIERMEM_HBM_LAYOUT=mapped gives every copy whole chunks of %s)",
                           HumanBytes(chunk));
  }
  return absl::StrFormat(
      " (TIERMEM_HBM_LAYOUT=mapped gives every copy whole chunks of %s: its %s take %s)",
      HumanBytes(chunk), HumanBytes(bytes), HumanBytes(rounded));
}

absl::Status Room::NeverFits(const absl::Status& failed, const Tensor& t, tm_tier tier) {
  const uint64_t capacity = core_.tiers()->space(tier).capacity();
  return Error(ToTmStatus(failed),
               absl::StrFormat("tensor \"%s\" needs %s, more than the whole %s tier (%s): it can "
                               "never fit there%s",
                               t.name, HumanBytes(t.bytes), tm_tier_name(tier),
                               HumanBytes(capacity), ChunkRounding(tier, t.bytes)));
}

absl::Status Room::OutOfRoom(const absl::Status& failed, EvictionPlan& plan, const Tensor& t,
                             tm_tier tier) {
  TierSpace& space = core_.tiers()->space(tier);
  const uint64_t capacity = space.capacity();
  const uint64_t need = space.Rounded(t.bytes);
  uint64_t pinned = 0;
  std::string by;
  std::sort(plan.pinned.begin(), plan.pinned.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  for (size_t i = 0; i < plan.pinned.size(); ++i) {
    pinned += plan.pinned[i].second;
    if (i < 4)
      absl::StrAppendFormat(&by, "%s\"%s\" (%s)", i == 0 ? "" : ", ", plan.pinned[i].first,
                            HumanBytes(plan.pinned[i].second));
  }
  if (plan.pinned.size() > 4) absl::StrAppendFormat(&by, " and %zu more", plan.pinned.size() - 4);
  // A slab needs one hole: the bytes that evicting every unpinned copy would free may suffice
  // and still lie in pieces between the pinned ones. The largest piece says by how much.
  uint64_t largest = 0;
  for (size_t i = 0, run = 0; i < plan.slots.size(); ++i) {
    run = plan.slots[i].kind == EvictionSlot::Kind::kWall ? 0 : run + plan.slots[i].size;
    largest = std::max<uint64_t>(largest, run);
  }
  if (!space.counted() && plan.reclaimable >= need && largest < need) {
    return Error(
        ToTmStatus(failed),
        absl::StrFormat("%s; evicting every unpinned copy would free %s of %s, enough "
                        "bytes, but acquired (pinned) copies split them: the largest "
                        "hole between pinned copies would be %s, and a copy in the slab "
                        "layout needs one hole; %s are pinned%s%s",
                        failed.message(), HumanBytes(plan.reclaimable), HumanBytes(capacity),
                        HumanBytes(largest), HumanBytes(pinned), by.empty() ? "" : ": ", by));
  }
  return Error(ToTmStatus(failed),
               absl::StrFormat("%s; it cannot fit even with every unpinned copy evicted: %s of %s "
                               "are held by acquired (pinned) copies%s%s%s",
                               failed.message(), HumanBytes(pinned), HumanBytes(capacity),
                               by.empty() ? "" : ": ", by, ChunkRounding(tier, t.bytes)));
}

std::optional<absl::StatusOr<Extent>> Room::Allocate(Request& req) {
  const uint64_t need = core_.tiers()->space(req.tier_).Rounded(req.t_.bytes);
  if (!req.admitted_) {
    if (auto s = AdmitPrefetch(req.t_, req.tier_, req.want_, need, req.why_); !s.ok()) return s;
    req.admitted_ = true;
    if (core_.trace()->enabled()) req.for_whom_ = req.t_.name;
  }
  req.victims_.clear();
  std::optional<absl::StatusOr<Extent>> result = MakeRoom(req, need);
  if (!result.has_value()) return std::nullopt;  // the caller evicts req.victims() first
  return Finish(req, *std::move(result));
}

absl::StatusOr<Extent> Room::Finish(Request& req, absl::StatusOr<Extent> result) {
  TierSpace& space = core_.tiers()->space(req.tier_);
  Tensor& t = req.t_;
  if (req.wanting_) core_.UnwantRoom(req.tier_);
  req.wanting_ = false;
  if (req.made_room_ != nullptr) *req.made_room_ = req.room_made_;
  if (result.ok() && req.want_.kind == Want::kPrefetch && req.tier_ != TM_TIER_NVME &&
      !space.counted() && !LeavesHoles(t, req.tier_, req.want_)) {
    space.Free(*result);
    return DroppedPrefetch(t, req.tier_, DropReason::kNoRoom, kLeavesNoHole, req.why_);
  }
  if (result.ok()) {
    // Memory a copy down is still reading (Vacate): the caller writes after its fences, or
    // this waits for them (t is busy: nothing else touches it meanwhile).
    std::vector<RangeFence> fences = BehindFences(req.tier_, result->offset, result->size);
    if (req.behind_ != nullptr) {
      *req.behind_ = std::move(fences);
    } else if (!fences.empty()) {
      req.waited_ = true;
      core_.Unlock();
      for (const RangeFence& r : fences) (void)r.fence->Wait();  // a failure is the copy's
      core_.Lock();
    }
  }
  if (req.waited_) {
    ++counters_.demand_waits;
    counters_.demand_wait_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Trace::Clock::now() - req.start_)
            .count());
  }
  return result;
}

std::vector<uint64_t> Room::Victims(const EvictionPlan& plan) {
  std::vector<uint64_t> victims;
  for (size_t i = plan.window->first; i <= plan.window->last; ++i) {
    if (plan.slots[i].kind == EvictionSlot::Kind::kEvictable) victims.push_back(plan.owners[i]);
  }
  return victims;
}

absl::StatusOr<Extent> Room::TryAllocate(Tensor& t, tm_tier tier) {
  TierSpace& space = core_.tiers()->space(tier);
  auto frees_after = [&](uint64_t owner)
                         ABSL_NO_THREAD_SAFETY_ANALYSIS { return FreesAfter(owner, tier); };
  auto e = space.Allocate(t.bytes, t.name, t.handle, frees_after);
  if (!e.ok() && absl::IsResourceExhausted(e.status()) && core_.HasDeferred()) {
    // What callers' work has finished with, and memory copies down leave (vacate.cc).
    core_.ReapDeferredForRoom(tier);
    e = space.Allocate(t.bytes, t.name, t.handle, frees_after);
  }
  return e;
}

std::optional<absl::StatusOr<Extent>> Room::MakeRoom(Request& req, uint64_t need) {
  Tensor& t = req.t_;
  const tm_tier tier = req.tier_;
  const Want want = req.want_;
  DropReason* const why = req.why_;
  TierSpace& space = core_.tiers()->space(tier);
  for (;;) {
    if (want.kind != Want::kDemand && core_.RoomWanted(tier)) {
      return DroppedPrefetch(t, tier, DropReason::kDemand, "a demand needs the room", why);
    }
    absl::StatusOr<Extent> e = TryAllocate(t, tier);
    // The framework's allocator was short though the budget had room (lib/tiers/tier_space.h):
    // it may be short because tiermem holds its memory, so a demand gives back copies of
    // `need` bytes, once, and asks again; a prefetch is dropped.
    const bool backing_short = !e.ok() && IsBackingShort(e.status());
    if (backing_short && (want.kind != Want::kDemand || req.backing_retried_)) {
      if (want.kind != Want::kDemand && why != nullptr) *why = DropReason::kNoRoom;
      return e;
    }
    if (!backing_short &&
        (e.ok() || tier == TM_TIER_NVME || !absl::IsResourceExhausted(e.status()))) {
      return e;
    }
    if (need == 0) return NeverFits(e.status(), t, tier);
    req.room_made_ = true;
    if (!want.evicts)
      return DroppedPrefetch(t, tier, DropReason::kNoRoom, "it takes only free room", why);
    if (want.kind == Want::kDemand && !req.wanting_) {
      req.wanting_ = true;
      core_.WantRoom(tier);
    }
    // Backing short: the budget's free bytes count in a window but free nothing in the
    // framework's allocator, so the victims alone must cover `need`.
    EvictionPlan plan =
        PlanEviction(t, tier, want, backing_short ? need + space.free_bytes() : need);
    const bool victims = plan.window.has_value() && plan.window->victims > 0;
    if (backing_short) {
      req.backing_retried_ = true;
      if (!victims) return e;
    }
    if (victims) {
      // Free bytes sufficed, no hole did: the window clears contiguity, not bytes.
      const bool fragmented = !backing_short && plan.free_bytes >= need;
      if (fragmented && SlidRatherThanEvict(plan, tier, need, req)) continue;
      // A prefetch whose allocation the hole check would undo evicts nothing firreq.
      if (want.kind == Want::kPrefetch && !space.counted() &&
          !LeavesHoles(t, tier, want, WindowPlaced(plan, need))) {
        return DroppedPrefetch(t, tier, DropReason::kNoRoom, kLeavesNoHole, why);
      }
      // The caller evicts them (writing down what must be), then asks again.
      req.fragmented_ = fragmented;
      req.victims_ = Victims(plan);
      return std::nullopt;
    }
    // No window: the free bytes may still be there, split by copies nobody holds. Slide those
    // together (once per request) and look again.
    if (!req.compacted_ && plan.free_bytes >= need) {
      req.compacted_ = true;
      if (Compact(tier, need)) continue;
    }
    if (want.kind != Want::kDemand) {
      return DroppedPrefetch(t, tier, DropReason::kNoRoom,
                             want.kind == Want::kPrefetch
                                 ? "nothing used after it can be evicted to fit it"
                                 : "nothing unpinned can be evicted to fit it",
                             why);
    }
    // A demand: prefetches queued for this tier would only take room; moves in flight will
    // finish (and their copies become evictable), so wait for them. Only when nothing is in
    // flight and the pinned copies leave no hole is the request beyond help.
    counters_.cancelled += jobs_.CancelPrefetches(tier);
    if (plan.in_flight || plan.window.has_value()) {
      req.waited_ = true;
      core_.WaitForChange(absl::Milliseconds(20));
      continue;
    }
    return OutOfRoom(e.status(), plan, t, tier);
  }
}

bool Room::SlidRatherThanEvict(const EvictionPlan& plan, tm_tier tier, uint64_t need,
                               Request& req) {
  // The window evicts copies used again, which would cross the link twice to come back (once,
  // a clean one): sliding copies together at device speed (once per request) is cheaper when
  // it moves no more bytes than the window would evict.
  if (req.compacted_ || !UsedAgain(*plan.window)) return false;
  req.compacted_ = true;
  const std::optional<uint64_t> slide = CompactionBytes(tier, need);
  return slide.has_value() && *slide <= plan.window->evicted_bytes && Compact(tier, need);
}

std::optional<Room::WriteDown> Room::Evict(Request& req, Tensor& v) {
  const tm_tier tier = req.tier_;
  // Evictions release the lock (a write-down, a landing waited for): skip a victim that
  // changed since the window was planned.
  if (v.busy() || v.copies[tier].pins > 0 || !v.copies[tier].valid() ||
      v.copies[tier].state == CopyState::kWriting) {
    return std::nullopt;
  }
  const Trace::Clock::time_point start = Trace::Clock::now();
  if (v.landing.has_value() && v.landing_tier == tier) {
    core_.WaitLanded(v);  // its stream-ordered copy must be done before its memory is reused
    if (!v.copy(tier).valid()) {
      if (req.fragmented_) ++counters_.fragmentation_evictions;
      return std::nullopt;
    }
  }
  const bool clean = !v.only_copy(tier);  // another tier holds the bytes: dropped, not written
  if (!clean && recompute_.DropsForRecompute(v, tier)) {
    recompute_.DropForRecompute(v, tier, start);  // rebuilt by its callback: cheaper than the
                                                  // round trip
    if (req.fragmented_) ++counters_.fragmentation_evictions;
    return std::nullopt;
  }
  if (clean) {
    Evicted(req, v, true, start);
    return std::nullopt;
  }
  // The only copy: written one tier down first (which may evict there in turn). From HBM,
  // when DRAM cannot take it, straight to NVMe through the staging slots.
  WriteDown w{tier, static_cast<tm_tier>(tier + 1), req.want_, start};
  w.want.release_room = false;  // part of making room: the token stays
  // HBM's copy goes once DRAM has it: hand it on, and let the move making room follow.
  w.want.vacates = w.want.lands = tier == TM_TIER_HBM;
  return w;
}

absl::Status Room::WrittenDown(Request& req, Tensor& v, const WriteDown& w, absl::Status s) {
  if (!s.ok()) {
    if (req.want_.kind != Want::kDemand && req.why_ != nullptr) *req.why_ = DropReason::kNoRoom;
    return Finish(req, WithContext(s, absl::StrFormat("evicting \"%s\" to make room", v.name)))
        .status();
  }
  // Acquired or changed while the lock was released: look again. (Absent: handed on as its
  // copy down ran, see vacate.cc.)
  const CopyState state = v.copy(w.from).state;
  if (v.copy(w.from).pins > 0 || (state != CopyState::kValid && state != CopyState::kAbsent)) {
    if (req.fragmented_) ++counters_.fragmentation_evictions;
    return absl::OkStatus();
  }
  Evicted(req, v, false, w.start);
  return absl::OkStatus();
}

void Room::Evicted(Request& req, Tensor& v, bool clean, Trace::Clock::time_point start) {
  const uint64_t bytes = v.bytes;
  core_.FreeCopy(v, req.tier_);
  ++counters_.evictions;
  counters_.eviction_bytes += bytes;
  if (req.fragmented_) ++counters_.fragmentation_evictions;
  if (clean) {
    ++counters_.clean_drops;
    counters_.clean_drop_bytes += bytes;
  }
  if (core_.trace()->enabled()) {
    static constexpr const char* kFor[] = {"a demand (an acquire, write or offload)",
                                           "a prefetch (tm_tensor_prefetch)",
                                           "a scheduled prefetch"};
    core_.trace()->Add(clean ? Trace::kCleanDrop : Trace::kEviction, v.name, start,
                       Trace::Clock::now(), bytes,
                       absl::StrFormat("room in %s for tensor \"%s\", %s", tm_tier_name(req.tier_),
                                       req.for_whom_, kFor[req.want_.kind]));
  }
}

}  // namespace tiermem
