// The order of uses (acquires, writes, reads) in a training step. Every step is recorded; the
// first recording becomes the schedule, later steps replay it (the runtime prefetches what comes
// next and evicts what is used furthest away), and a step that departs from it is relearned at
// its end. Releases are recorded beside the uses (before which use each acquire ended), so
// that admission can count the room a copy held now gives back before an earlier use needs it.
// A framework can also set the order explicitly. Positions are absolute (they keep
// counting across steps), so "next use" compares across the step boundary of a cyclic loop.
//
// Uses are matched across steps by a tensor's key, not its handle, because frameworks create
// fresh tensors every step (PyTorch saves new activations each forward). The runtime derives
// the key (Runtime::KeyFor): from the tensor's name when it has one; else, for a tensor created
// inside a step, from its creation order within the step and its size; else (created outside
// any step: parameters, optimizer state) from its handle. Not thread-safe: the runtime locks.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tiermem/tiermem.h"

namespace tiermem {

class Schedule {
 public:
  static constexpr uint64_t kNever = UINT64_MAX;

  struct Use {
    uint64_t key = 0;
    tm_tier tier = TM_TIER_HBM;
    bool fill = true;    // false for an acquire that overwrites the whole tensor: nothing to bring
    uint64_t bytes = 0;  // the tensor's size: room a use needs even before its tensor exists
  };

  void BeginStep();
  // Adopts this step's recording when there was no schedule or the step departed from it.
  void EndStep();
  // An explicit order; replayed from the next acquire on.
  void Set(std::vector<Use> uses);
  // Notes a use: advances the position, or marks the step as departed.
  void OnUse(uint64_t key, tm_tier tier, bool fill, uint64_t bytes);
  // Notes that the key's last acquire was released (its last pin let go): the schedule learns
  // before which use each acquire ends, as it learns the order of uses.
  void OnRelease(uint64_t key);

  // In a step, with a schedule to follow.
  bool replaying() const { return in_step_ && !uses_.empty(); }
  bool in_step() const { return in_step_; }
  size_t size() const { return uses_.size(); }
  // Absolute position of the next expected use.
  uint64_t now() const { return base_ + pos_; }
  // The next `n` uses after the current position (wrapping into the next step), with their
  // absolute positions.
  std::vector<std::pair<uint64_t, Use>> Upcoming(size_t n) const;
  // Absolute position of the key's next use, at or after now(); kNever if unscheduled.
  uint64_t NextUse(uint64_t key) const;
  // Calls f(position, use) for the uses at absolute positions [now(), end), at most one step.
  template <typename F>
  void ForEachBefore(uint64_t end, F&& f) const {
    if (uses_.empty()) return;
    for (size_t k = 0; k < uses_.size() && base_ + pos_ + k < end; ++k) {
      f(base_ + pos_ + k, uses_[(pos_ + k) % uses_.size()]);
    }
  }
  // Absolute position of the use before which the key's acquire in progress (its latest use
  // before now()) was let go in the recorded step; kNever if unknown (not acquired earlier in
  // this step, an explicit schedule, or held to the step's end).
  uint64_t ReleasedBy(uint64_t key) const;
  // Steps that departed from the schedule (and were relearned).
  uint64_t relearned() const { return relearned_; }

 private:
  static constexpr uint32_t kHeld = UINT32_MAX;  // not released within the step

  void Adopt(std::vector<Use> uses);

  std::vector<Use> uses_;
  std::vector<uint32_t> released_by_;  // per use: index of the use its acquire ends before
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> positions_;  // key -> sorted indices
  std::vector<Use> recording_;
  std::vector<uint32_t> recorded_releases_;                // per recorded use, as released_by_
  absl::flat_hash_map<uint64_t, uint32_t> last_recorded_;  // key -> index of its latest use
  bool in_step_ = false;
  bool departed_ = false;
  size_t pos_ = 0;     // index in uses_ of the next expected use
  uint64_t base_ = 0;  // absolute position of uses_[0] in this step
  uint64_t relearned_ = 0;
};

}  // namespace tiermem
