// Inclusive DRAM (TIERMEM_DRAM_INCLUSIVE): whether to keep clean DRAM copies beside NVMe ones
// (in free room only), and the counts of reads they serve. It decides from the schedule
// (Prefetcher's) and returns what to copy; Moves makes the copies. Calls the core and the
// Prefetcher only.
#pragma once

#include <optional>

#include "lib/runtime/core.h"

namespace tiermem {

class Prefetcher;

class WriteThrough {
 public:
  WriteThrough(Core& core, Prefetcher& prefetcher) : core_(core), prefetcher_(prefetcher) {}
  WriteThrough(const WriteThrough&) = delete;
  WriteThrough& operator=(const WriteThrough&) = delete;

  // Inclusive DRAM (write_through.cc), before an offload of t to NVMe: whether t's DRAM copy is
  // to be kept once NVMe holds the bytes, when TIERMEM_DRAM_INCLUSIVE is on and DRAM has free
  // room that no earlier scheduled use needs. `copy_down`: t has no DRAM copy yet, and one is to
  // be made from HBM first with this Want (evicting nothing); kept only when that copy is made.
  struct KeepPlan {
    bool keep = false;
    std::optional<Want> copy_down;
  };
  KeepPlan PlanKeep(const Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
  // Inclusive DRAM, upward: before a prefetch (or hint) moves t from NVMe to HBM, the Want of a
  // DRAM copy to make first in free room under the same rules, so that the move up reads DRAM
  // and the copy stays for later steps; nullopt: none.
  std::optional<Want> ReadThroughWant(const Tensor& t, Want want)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock);
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
  Prefetcher& prefetcher_;
};

}  // namespace tiermem
