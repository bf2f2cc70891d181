// The order of acquires in a training step. Every step is recorded; the first recording becomes
// the schedule, later steps replay it (the runtime prefetches what comes next and evicts what is
// used furthest away), and a step that departs from it is relearned at its end. A framework can
// also set the order explicitly. Positions are absolute (they keep counting across steps), so
// "next use" compares across the step boundary of a cyclic loop. Not thread-safe: the runtime
// locks.
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
    uint64_t handle = 0;
    tm_tier tier = TM_TIER_HBM;
    bool fill = true;  // false for an acquire that overwrites the whole tensor: nothing to bring
  };

  void BeginStep();
  // Adopts this step's recording when there was no schedule or the step departed from it.
  void EndStep();
  // An explicit order; replayed from the next acquire on.
  void Set(std::vector<Use> uses);
  // Notes an acquire: advances the position, or marks the step as departed.
  void OnAcquire(uint64_t handle, tm_tier tier, bool fill);

  // In a step, with a schedule to follow.
  bool replaying() const { return in_step_ && !uses_.empty(); }
  bool in_step() const { return in_step_; }
  size_t size() const { return uses_.size(); }
  // Absolute position of the next expected use.
  uint64_t now() const { return base_ + pos_; }
  // The next `n` uses after the current position (wrapping into the next step), with their
  // absolute positions.
  std::vector<std::pair<uint64_t, Use>> Upcoming(size_t n) const;
  // Absolute position of the handle's next use, at or after now(); kNever if unscheduled.
  uint64_t NextUse(uint64_t handle) const;
  // Steps that departed from the schedule (and were relearned).
  uint64_t relearned() const { return relearned_; }

 private:
  void Adopt(std::vector<Use> uses);

  std::vector<Use> uses_;
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> positions_;  // handle -> sorted indices
  std::vector<Use> recording_;
  bool in_step_ = false;
  bool departed_ = false;
  size_t pos_ = 0;     // index in uses_ of the next expected use
  uint64_t base_ = 0;  // absolute position of uses_[0] in this step
  uint64_t relearned_ = 0;
};

}  // namespace tiermem
