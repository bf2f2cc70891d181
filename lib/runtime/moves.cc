// Moves (moves.h): on a claimed tensor, prepare a move under the lock, run it without the lock,
// commit its outcome to the copy states; a copy reserved for a caller to fill; an offload down.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

absl::StatusOr<Extent> Moves::Allocate(Tensor& t, tm_tier tier, Want want, DropReason* why,
                                       bool* made_room, std::vector<RangeFence>* behind) {
  Room::Request req(t, tier, want, why, made_room, behind);
  for (;;) {
    std::optional<absl::StatusOr<Extent>> done = room_.Allocate(req);
    if (done.has_value()) return *std::move(done);
    // Room chose a window of victims: each dropped by Room, or written down here first.
    for (const uint64_t handle : std::vector<uint64_t>(req.victims())) {
      Tensor* v = core_.Lookup(handle);
      if (v == nullptr) continue;
      const std::optional<Room::WriteDown> w = room_.Evict(req, *v);
      if (!w.has_value()) continue;
      absl::Status s = MakeValid(*v, w->to, {}, w->want);
      if (!s.ok() && w->from == TM_TIER_HBM && absl::IsResourceExhausted(s)) {
        s = MakeValid(*v, TM_TIER_NVME, {}, w->want);
      }
      if (auto failed = room_.WrittenDown(req, *v, *w, std::move(s)); !failed.ok()) return failed;
    }
  }
}

absl::Status Moves::Rebuild(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                            DropReason* why) {
  if (auto s = recompute_.CheckRebuild(t, dst, want, why); !s.ok()) return s;
  BusyScope busy(t, core_);  // no other operation touches it until the rebuild is committed
  auto extent = Allocate(t, dst, want, why);
  if (want.release_room) core_.ReleaseRoom();
  if (!extent.ok()) {
    return WithContext(extent.status(), absl::StrFormat("room to recompute tensor \"%s\" in %s",
                                                        t.name, tm_tier_name(dst)));
  }
  return recompute_.Fill(t, dst, *extent, caller);
}

bool Moves::ReadThroughDram(Tensor& t, Want want) {
  std::optional<Want> down = write_through_.ReadThroughWant(t, want);
  if (!down.has_value()) return false;
  // Failing (no free room, a read error) leaves the move up to go through staging.
  DropReason why = DropReason::kNone;
  return MakeValid(t, TM_TIER_DRAM, {}, *down, &why).ok();
}

absl::Status Moves::MakeValid(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                              DropReason* why) {
  if (t.copy(dst).valid()) return absl::OkStatus();
  if (t.dropped) return Rebuild(t, dst, caller, want, why);  // no copy: rebuilt
  if (int w = t.writing_tier(); w >= 0) {
    // Copying bytes that a writer is changing would make a torn copy look valid.
    if (why != nullptr) *why = DropReason::kSuperseded;
    return Error(TM_ERR_BUSY, absl::StrFormat("tensor \"%s\" is acquired for writing in %s", t.name,
                                              tm_tier_name(static_cast<tm_tier>(w))));
  }
  // Inclusive DRAM: a prefetch from NVMe to HBM reads through DRAM and keeps that copy.
  const bool read_through = dst == TM_TIER_HBM && ReadThroughDram(t, want);
  BusyScope busy(t, core_);  // for the whole move: eviction below may release the lock too
  std::vector<RangeFence> behind;
  auto extent = Allocate(t, dst, want, why, nullptr, &behind);
  if (want.release_room) core_.ReleaseRoom();  // room made: the move needs none
  if (!extent.ok()) return extent.status();

  MovePlan plan = PrepareMove(t, dst, *extent, caller);
  plan.behind = std::move(behind);
  const bool moves_behind = !plan.behind.empty();
  bool vacated = false;  // a copy down whose HBM memory was handed on as it ran
  room_.OfferVacate(t, plan, want, &vacated);
  // A large scheduled prefetch up the link goes in the order of the uses (LinkOrder).
  const bool ordered = want.kind == Want::kPrefetch && dst == TM_TIER_HBM &&
                       plan.src == TM_TIER_DRAM && plan.stream == nullptr &&
                       plan.bytes >= LinkOrder::kMinBytes;
  // A large demand up the link: the ordered prefetches enqueued while it runs wait for it.
  const bool urgent = want.kind == Want::kDemand && dst == TM_TIER_HBM &&
                      plan.src == TM_TIER_DRAM && plan.bytes >= LinkOrder::kMinBytes;

  // Execute without the lock.
  std::optional<io::CopyTicket> pending;
  core_.Unlock();
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
  absl::Status s = core_.mover()->Execute(plan, &pending);
  if (ordered && !left) link_order_.Leave(nullptr);
  if (urgent && !registered) link_order_.Urgent(nullptr);
  if (core_.trace()->enabled() && plan.src >= 0) TraceMove(t, plan, start, vacated);
  core_.Lock();

  // Commit: the destination becomes valid only now; a failure frees it and leaves the rest.
  if (!s.ok()) {
    core_.FreeCopy(t, dst);
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
  if (pending.has_value()) Land(t, plan, *pending, vacated);
  if (dst == TM_TIER_HBM) write_through_.NoteCleanRead(t, plan.src, t.bytes, start);
  // Kept: its next read saves one of NVMe (this one did not; it read NVMe to make the copy).
  if (read_through && t.copy(TM_TIER_DRAM).valid()) t.copy(TM_TIER_DRAM).kept_clean = true;
  return absl::OkStatus();
}

bool Moves::StartPrefetch(Tensor& t, uint64_t horizon) {
  constexpr tm_tier kDst = TM_TIER_HBM;
  if (t.busy() || t.queued > 0 || t.dropped || t.writing_tier() >= 0 || t.landing.has_value() ||
      t.copy(kDst).state != CopyState::kAbsent || t.copy(TM_TIER_DRAM).state != CopyState::kValid) {
    return false;
  }
  Want want{Want::kPrefetch, horizon};
  want.evicts = false;  // evicting writes down and waits: a mover's work
  DropReason why = DropReason::kNone;
  std::vector<RangeFence> behind;
  auto extent = Allocate(t, kDst, want, &why, nullptr, &behind);
  if (!extent.ok()) return false;  // the mover may evict for it, or drops it (counted)
  if (!behind.empty()) {
    core_.tiers()->space(kDst).Free(*extent);
    return false;
  }
  MovePlan plan = PrepareMove(t, kDst, *extent, CallerStream{});
  plan.enqueue_only = true;
  const Trace::Clock::time_point start = Trace::Clock::now();
  std::optional<io::CopyTicket> pending;
  // Under the lock: the engine only enqueues (the emulated device may copy a small one at once).
  absl::Status s = core_.mover()->Execute(plan, &pending);
  if (core_.trace()->enabled()) TraceMove(t, plan, start, false);
  if (!s.ok() || !pending.has_value()) {
    core_.FreeCopy(t, kDst);
    if (s.ok()) s = Error(TM_ERR_DEVICE, "the copy engine returned no ticket");
    core_.RecordFailure(
        t, WithContext(s, absl::StrFormat("prefetching tensor \"%s\" (%s) to %s", t.name,
                                          HumanBytes(t.bytes), tm_tier_name(kDst))));
    return true;
  }
  t.EndFill(kDst);
  Land(t, plan, *pending, /*vacated=*/false);
  write_through_.NoteCleanRead(t, TM_TIER_DRAM, t.bytes, start);
  return true;
}

void Moves::Land(Tensor& t, const MovePlan& plan, const io::CopyTicket& ticket, bool vacated) {
  t.Land(plan.dst, ticket, /*replaces=*/false, /*own=*/vacated);
  // The copy still reads its source: that copy is freed or written only once it has passed. (A
  // vacated source is HBM memory handed on, fenced piece by piece.)
  if (!vacated && plan.src >= 0)
    t.copy(static_cast<tm_tier>(plan.src)).uses.push_back(ticket.fence);
}

void Moves::TraceMove(const Tensor& t, const MovePlan& plan, Trace::Clock::time_point start,
                      bool vacated) {
  static constexpr Trace::Track kTrack[TM_TIER_COUNT][TM_TIER_COUNT] = {
      {Trace::kAcquire, Trace::kDeviceToHost, Trace::kHbmToNvme},
      {Trace::kHostToDevice, Trace::kAcquire, Trace::kNvmeWrite},
      {Trace::kNvmeToHbm, Trace::kNvmeRead, Trace::kAcquire}};
  const Trace::Track track = kTrack[plan.src][plan.dst];
  if (!plan.behind.empty()) {
    uint64_t behind = 0;
    for (const RangeFence& r : plan.behind) behind += r.size;
    core_.trace()->Add(track, t.name, start, Trace::Clock::now(), plan.bytes,
                       absl::StrFormat("written behind copies down still reading %s of its memory",
                                       HumanBytes(behind)));
  } else if (vacated) {
    core_.trace()->Add(track, t.name, start, Trace::Clock::now(), plan.bytes,
                       plan.lands ? "its hbm memory handed on once enqueued; lands (not waited for)"
                                  : "its hbm memory handed on once enqueued");
  } else {
    core_.trace()->Add(track, t.name, start, Trace::Clock::now(), plan.bytes);
  }
}

MovePlan Moves::PrepareMove(Tensor& t, tm_tier dst, const Extent& extent,
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
    for (io::FencePtr& f : core_.PendingUses(t, src)) plan.after.push_back(std::move(f));
    plan.src_extent = t.copy(src).extent;
    if (src != TM_TIER_NVME) plan.src_addr = core_.tiers()->Address(src, plan.src_extent);
  }
  t.BeginFill(dst, extent);
  plan.dst_extent = extent;
  if (dst != TM_TIER_NVME) plan.dst_addr = core_.tiers()->Address(dst, extent);
  return plan;
}

absl::Status Moves::Reserve(Tensor& t, tm_tier tier, bool* made_room) {
  if (t.copy(tier).valid()) return absl::OkStatus();
  BusyScope busy(t, core_);
  std::vector<RangeFence> behind;
  auto e = Allocate(t, tier, Want{}, nullptr, made_room, &behind);
  if (!e.ok()) return e.status();
  t.BeginFill(tier, *e);
  // Memory a copy down still reads: the caller's writes wait for it as for a caller's use (on
  // its stream, or the host before the pointer is handed out).
  for (RangeFence& r : behind) t.copy(tier).uses.push_back(std::move(r.fence));
  return absl::OkStatus();
}

absl::Status Moves::OffloadClaimed(Tensor& t, tm_tier tier) {
  if (!t.materialized()) return absl::OkStatus();  // zeros need no space anywhere
  if (auto s = core_.CheckAboveUnpinned(t, tier); !s.ok()) return s;
  // Inclusive DRAM: with a DRAM copy valid, the move below writes NVMe from it (the nearest).
  // Counted as a write-through only when it writes: NVMe may hold the bytes already.
  const bool writes = !t.copy(tier).valid();
  bool made = false;  // the clean DRAM copy was made here (freed again when the offload fails)
  bool keep_dram = false;
  if (tier == TM_TIER_NVME) {
    WriteThrough::KeepPlan keep = write_through_.PlanKeep(t);
    keep_dram = keep.keep;
    if (keep.copy_down.has_value()) {
      DropReason down_why = DropReason::kNone;
      keep_dram = made = MakeValid(t, TM_TIER_DRAM, {}, *keep.copy_down, &down_why).ok();
    }
  }
  // DRAM holds the bytes now: HBM's copy is freed before the NVMe write rather than after it,
  // so that the prefetches and demands waiting for HBM room get it a write's time sooner. A
  // failed write then leaves the tensor valid in DRAM. (Unless an acquire in HBM waits for
  // this offload: that copy stays, below.)
  if (keep_dram && t.copy(TM_TIER_DRAM).valid() && t.copy(TM_TIER_HBM).valid() &&
      !core_.WantedInHbm(t.handle)) {
    core_.FreeCopy(t, TM_TIER_HBM);
    prefetcher_.IssuePrefetches();
    core_.NotifyChanged();
  }
  Want want = Demand();
  want.vacates = tier == TM_TIER_DRAM;  // HBM's copy goes once DRAM has it: hand it on
  if (auto s = MakeValid(t, tier, {}, want); !s.ok()) {
    // The clean copy made for it goes, unless it holds the bytes now: HBM's copy was freed
    // (above, or handed on as the copy down ran).
    if (made && t.copy(TM_TIER_HBM).valid() && t.copy(TM_TIER_DRAM).state == CopyState::kValid) {
      core_.FreeCopy(t, TM_TIER_DRAM);
    }
    return s;
  }
  // An acquire in HBM has waited for this offload: NVMe holds the bytes now, so HBM's copy is
  // clean and stays for it, rather than being freed and brought straight back up.
  const bool keep_hbm =
      tier == TM_TIER_NVME && core_.WantedInHbm(t.handle) && t.copy(TM_TIER_HBM).valid();
  for (int above = 0; above < tier; ++above) {
    if (keep_dram && above == TM_TIER_DRAM) continue;  // clean now: NVMe holds its bytes
    if (keep_hbm && above == TM_TIER_HBM) continue;
    core_.FreeCopy(t, static_cast<tm_tier>(above));
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

}  // namespace tiermem
