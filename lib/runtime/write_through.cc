// Inclusive DRAM: an offload to NVMe writes the bytes down and keeps a clean DRAM copy while DRAM
// has room that no earlier scheduled use needs, so that the next move up reads DRAM instead of
// NVMe. Exclusive tiers pay a read they could have skipped; every tiered cache of note (the page
// cache, ZeRO-Infinity's pinned buffers of the latest swap-outs, FlexGen's CPU weight cache)
// keeps the upper copy while it has room. A clean copy costs nothing to drop (NVMe holds its
// bytes), and eviction drops clean copies before it writes a dirty one (lib/runtime/room.cc).
#include "lib/runtime/runtime.h"

namespace tiermem {

bool Runtime::KeepCleanDramCopy(Tensor& t, bool* made) {
  *made = false;
  if (!config_.dram_inclusive || t.writing_tier() >= 0) return false;
  // Already in DRAM: the offload writes NVMe from it, and keeping it costs no room.
  if (t.copy(TM_TIER_DRAM).state == CopyState::kValid) return true;
  if (!t.copy(TM_TIER_HBM).valid() || t.copy(TM_TIER_DRAM).state != CopyState::kAbsent) {
    return false;
  }
  // From HBM: a copy down to DRAM first, in free room only (it evicts nothing), then NVMe is
  // written from it. Under a schedule it is a prefetch that serves t's next use, with the
  // do-no-harm rule of prefetches: it takes only room that no earlier use needs, and none when
  // t is not used again this step.
  Want want{Want::kHint, Schedule::kNever, /*release_room=*/false, /*evicts=*/false};
  if (schedule_.replaying() && FindKey(t.key) == &t) {
    const uint64_t next = schedule_.NextUse(t.key);
    if (next == Schedule::kNever) return false;
    want.kind = Want::kPrefetch;
    want.horizon = next;
  }
  DropReason why = DropReason::kNone;
  if (!MakeValid(t, TM_TIER_DRAM, {}, want, &why).ok()) return false;
  *made = true;
  return true;
}

void Runtime::NoteCleanRead(const Tensor& t, int src, uint64_t bytes,
                            Trace::Clock::time_point start) {
  // A DRAM copy is clean when NVMe holds the same bytes. Only one kept by a write-through saved a
  // read of NVMe: one that a prefetch brought up from NVMe cost that read already.
  if (src != TM_TIER_DRAM || !t.copy(TM_TIER_DRAM).written_through ||
      !t.copy(TM_TIER_NVME).valid()) {
    return;
  }
  ++counters_.clean_reads;
  counters_.clean_read_bytes += bytes;
  trace_->Add(Trace::kCleanRead, t.name, start, Trace::Clock::now(), bytes);
}

}  // namespace tiermem
