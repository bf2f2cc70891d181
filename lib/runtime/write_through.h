// Inclusive DRAM (TIERMEM_DRAM_INCLUSIVE): clean DRAM copies kept beside NVMe ones, made in
// free room only, and the counts of reads they serve. Owns no state of its own: it judges from
// the schedule (Prefetcher's) and makes copies through Moves.
#pragma once

#include "lib/runtime/core.h"

namespace tiermem {

class Moves;
class Prefetcher;

class WriteThrough {
 public:
  WriteThrough(Core& core, Moves& moves, Prefetcher& prefetcher)
      : core_(core), moves_(moves), prefetcher_(prefetcher) {}
  WriteThrough(const WriteThrough&) = delete;
  WriteThrough& operator=(const WriteThrough&) = delete;

  // Inclusive DRAM (write_through.cc): before an offload of t to NVMe, makes sure t has a DRAM
  // copy to keep once NVMe holds the bytes, when TIERMEM_DRAM_INCLUSIVE is on and DRAM has free
  // room that no earlier scheduled use needs. Copies it down from HBM when needed (evicting
  // nothing). Returns whether t's DRAM copy is to be kept; `made`: it was made here (freed again
  // when the offload fails).
  bool KeepCleanDramCopy(Tensor& t, bool* made) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Inclusive DRAM, upward: before a prefetch (or hint) moves t from NVMe to HBM, makes a DRAM
  // copy of it in free room under the same rules, so that the move up reads DRAM and the copy
  // stays for later steps. Returns whether it made one.
  bool ReadThroughDram(Tensor& t, Want want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Counts a read of t's bytes upward (a move to HBM, a copy out to a caller) from `src`, when
  // that was a clean DRAM copy read instead of NVMe (write_through.cc).
  void NoteCleanRead(const Tensor& t, int src, uint64_t bytes, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // The same for an acquire in DRAM for reading, the first after the copy was kept.
  void NoteCleanDramAcquire(Tensor& t, Trace::Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  // What this part counted (Runtime::Stats adds every part's up).
  const Counters& counters() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) { return counters_; }

 private:
  // The Want of a clean DRAM copy of t (free room only, do no harm); false: t is not used again
  // this step, so keeping a copy serves nothing.
  bool CleanCopyWant(const Tensor& t, Want* want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);

  Core& core_;
  Counters counters_ ABSL_GUARDED_BY(runtime_lock);
  Moves& moves_;
  Prefetcher& prefetcher_;
};

}  // namespace tiermem
