// The runtime's event counters behind tm_stats. Each part of lib/runtime keeps its own (guarded by
// the runtime's lock) and counts what it does; Runtime::Stats adds them up.
#pragma once

#include <cstdint>

#include "tiermem/tiermem.h"

namespace tiermem {

// Why a prefetch was dropped (counted in tm_stats, never reported as a failure).
enum class DropReason { kNone, kNoRoom, kDemand, kSuperseded };

struct Counters {
  uint64_t acquires = 0, hits = 0, misses = 0, stall_ns = 0, prefetches = 0, evictions = 0,
           eviction_bytes = 0, dropped_no_room = 0, dropped_demand = 0, dropped_superseded = 0,
           cancelled = 0, moves_failed = 0, demand_waits = 0, demand_wait_ns = 0,
           fragmentation_evictions = 0;
  // Compaction (lib/runtime/compaction.cc).
  uint64_t relocations = 0, relocation_bytes = 0;
  // Callers' copies (lib/runtime/caller_copy.cc, the one path of all of them).
  uint64_t copied_in_bytes = 0, copied_out_bytes = 0;
  // Asynchronous offloads parked until a release (lib/runtime/job_queue.cc).
  uint64_t offloads_parked = 0;
  // Calls that waited for another thread's move of their tensor (Runtime::MoveWaits; not in
  // tm_stats).
  uint64_t move_waits = 0;
  // HBM memory handed on behind copies down (lib/runtime/vacate.cc).
  uint64_t handed_on = 0, handed_on_bytes = 0, moves_behind = 0, moves_behind_bytes = 0;
  // Of moves_failed, those that lost bytes: callers' copies, copies down from HBM handed on.
  uint64_t moves_failed_lost = 0;
  // Inclusive DRAM (lib/runtime/write_through.cc).
  uint64_t write_throughs = 0, write_through_bytes = 0, clean_reads = 0, clean_read_bytes = 0,
           clean_drops = 0, clean_drop_bytes = 0;
  // Recompute callbacks (lib/runtime/recompute.cc).
  uint64_t recompute_drops = 0, recompute_drop_bytes = 0, recomputes = 0, recompute_failures = 0,
           recompute_ns = 0;

  // Adds another part's counters (Runtime::Stats sums every part's).
  Counters& operator+=(const Counters& o) {
    acquires += o.acquires;
    hits += o.hits;
    misses += o.misses;
    stall_ns += o.stall_ns;
    prefetches += o.prefetches;
    evictions += o.evictions;
    eviction_bytes += o.eviction_bytes;
    dropped_no_room += o.dropped_no_room;
    dropped_demand += o.dropped_demand;
    dropped_superseded += o.dropped_superseded;
    cancelled += o.cancelled;
    moves_failed += o.moves_failed;
    demand_waits += o.demand_waits;
    demand_wait_ns += o.demand_wait_ns;
    fragmentation_evictions += o.fragmentation_evictions;
    relocations += o.relocations;
    relocation_bytes += o.relocation_bytes;
    copied_in_bytes += o.copied_in_bytes;
    copied_out_bytes += o.copied_out_bytes;
    offloads_parked += o.offloads_parked;
    move_waits += o.move_waits;
    handed_on += o.handed_on;
    handed_on_bytes += o.handed_on_bytes;
    moves_behind += o.moves_behind;
    moves_behind_bytes += o.moves_behind_bytes;
    moves_failed_lost += o.moves_failed_lost;
    write_throughs += o.write_throughs;
    write_through_bytes += o.write_through_bytes;
    clean_reads += o.clean_reads;
    clean_read_bytes += o.clean_read_bytes;
    clean_drops += o.clean_drops;
    clean_drop_bytes += o.clean_drop_bytes;
    recompute_drops += o.recompute_drops;
    recompute_drop_bytes += o.recompute_drop_bytes;
    recomputes += o.recomputes;
    recompute_failures += o.recompute_failures;
    recompute_ns += o.recompute_ns;
    return *this;
  }
  void CountDrop(DropReason why) {
    switch (why) {
      case DropReason::kDemand:
        ++dropped_demand;
        break;
      case DropReason::kSuperseded:
        ++dropped_superseded;
        break;
      default:
        ++dropped_no_room;
        break;
    }
  }
  // Writes the counters' fields of tm_stats.
  void Fill(tm_stats& s) const {
    s.acquires = acquires;
    s.acquire_hits = hits;
    s.acquire_misses = misses;
    s.acquire_stall_ns = stall_ns;
    s.prefetches = prefetches;
    s.evictions = evictions;
    s.eviction_bytes = eviction_bytes;
    s.prefetches_dropped_no_room = dropped_no_room;
    s.prefetches_dropped_demand = dropped_demand;
    s.prefetches_dropped_superseded = dropped_superseded;
    s.prefetches_dropped = dropped_no_room + dropped_demand + dropped_superseded;
    s.prefetches_cancelled = cancelled;
    s.moves_failed = moves_failed;
    s.demand_waits = demand_waits;
    s.demand_wait_ns = demand_wait_ns;
    s.fragmentation_evictions = fragmentation_evictions;
    s.write_throughs = write_throughs;
    s.write_through_bytes = write_through_bytes;
    s.clean_reads = clean_reads;
    s.clean_read_bytes = clean_read_bytes;
    s.clean_drops = clean_drops;
    s.clean_drop_bytes = clean_drop_bytes;
    s.recompute_drops = recompute_drops;
    s.recompute_drop_bytes = recompute_drop_bytes;
    s.recomputes = recomputes;
    s.recompute_failures = recompute_failures;
    s.recompute_ns = recompute_ns;
    s.relocations = relocations;
    s.relocation_bytes = relocation_bytes;
    s.copied_in_bytes = copied_in_bytes;
    s.copied_out_bytes = copied_out_bytes;
    s.offloads_parked = offloads_parked;
    s.hbm_handed_on = handed_on;
    s.hbm_handed_on_bytes = handed_on_bytes;
    s.moves_behind = moves_behind;
    s.moves_behind_bytes = moves_behind_bytes;
    s.moves_failed_lost = moves_failed_lost;
  }
};
// operator+= names every field: a field added above must be added there too.
static_assert(sizeof(Counters) == 37 * sizeof(uint64_t), "Counters::operator+= misses a field");

}  // namespace tiermem
