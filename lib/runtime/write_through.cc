// Inclusive DRAM: an offload to NVMe writes the bytes down and keeps a clean DRAM copy while DRAM
// has room that no earlier scheduled use needs, so that the next move up reads DRAM instead of
// NVMe. Exclusive tiers pay a read they could have skipped; every tiered cache of note (the page
// cache, ZeRO-Infinity's pinned buffers of the latest swap-outs, FlexGen's CPU weight cache)
// keeps the upper copy while it has room. The same holds on the way up: a prefetch from NVMe to
// HBM reads through DRAM and keeps that copy (read-through), so that a tensor homed on NVMe is
// read from NVMe once, not at every step. A clean copy costs nothing to drop (NVMe holds its
// bytes), and eviction drops clean copies before it writes a dirty one (lib/runtime/room.cc).
#include "lib/runtime/runtime.h"

namespace tiermem {

bool WriteThrough::CleanCopyWant(const Tensor& t, Want* want) {
  // In free room only (it evicts nothing). Under a schedule it is a prefetch that serves t's
  // next use, with the do-no-harm rule of prefetches: it takes only room that no earlier use
  // needs, and none when t is not used again this step. Its room made, it hands the room token
  // back: nothing after it makes room in HBM or DRAM (an offload's NVMe room evicts nothing),
  // so demands need not wait for its bytes to move.
  *want = Want{Want::kHint, Schedule::kNever, /*release_room=*/true, /*evicts=*/false};
  if (prefetcher_.schedule().replaying() && prefetcher_.FindKey(t.key) == &t) {
    const uint64_t next = prefetcher_.schedule().NextUse(t.key);
    if (next == Schedule::kNever) return false;
    want->kind = Want::kPrefetch;
    want->horizon = next;
  }
  return true;
}

WriteThrough::KeepPlan WriteThrough::PlanKeep(const Tensor& t) {
  KeepPlan plan;
  if (!core_.config().dram_inclusive || t.writing_tier() >= 0) return plan;
  // Already in DRAM: the offload writes NVMe from it, and keeping it costs no room.
  if (t.copy(TM_TIER_DRAM).state == CopyState::kValid) {
    plan.keep = true;
    return plan;
  }
  if (!t.copy(TM_TIER_HBM).valid() || t.copy(TM_TIER_DRAM).state != CopyState::kAbsent) {
    return plan;
  }
  // From HBM: a copy down to DRAM first, then NVMe is written from it.
  Want want;
  if (!CleanCopyWant(t, &want)) return plan;
  want.vacates = true;  // HBM's copy goes once DRAM has it (OffloadClaimed): hand it on
  plan.copy_down = want;
  return plan;
}

std::optional<Want> WriteThrough::ReadThroughWant(const Tensor& t, Want want) {
  // Only for prefetches and hints, which run on the movers: a demand's move stays one pipelined
  // NVMe -> HBM pass through the staging slots, whose latency the caller waits for (two moves
  // one after the other would add the link's time to the disk's).
  if (!core_.config().dram_inclusive || want.kind == Want::kDemand || !t.materialized() ||
      t.writing_tier() >= 0 || t.copy(TM_TIER_DRAM).state != CopyState::kAbsent ||
      t.copy(TM_TIER_HBM).state != CopyState::kAbsent || !t.copy(TM_TIER_NVME).valid()) {
    return std::nullopt;
  }
  Want down;
  if (!CleanCopyWant(t, &down)) return std::nullopt;
  down.release_room = false;  // a prefetch holds no token
  return down;
}

void WriteThrough::NoteCleanDramAcquire(Tensor& t, Trace::Clock::time_point start) {
  // Read in DRAM from a copy inclusive DRAM kept: the read of NVMe that exclusive tiers make
  // here is saved. Once: exclusive tiers keep the copy they read for later acquires too.
  NoteCleanRead(t, TM_TIER_DRAM, t.bytes, start);
  t.copy(TM_TIER_DRAM).kept_clean = false;
}

void WriteThrough::NoteCleanRead(const Tensor& t, int src, uint64_t bytes,
                                 Trace::Clock::time_point start) {
  // A DRAM copy is clean when NVMe holds the same bytes. Only one kept by a write-through (or by
  // a read-through, after the move it was made for) saved a read of NVMe: one that a prefetch
  // brought up from NVMe for this very move cost that read already.
  if (src != TM_TIER_DRAM || !t.copy(TM_TIER_DRAM).kept_clean || !t.copy(TM_TIER_NVME).valid()) {
    return;
  }
  ++counters_.clean_reads;
  counters_.clean_read_bytes += bytes;
  core_.trace()->Add(Trace::kCleanRead, t.name, start, Trace::Clock::now(), bytes);
}

}  // namespace tiermem
