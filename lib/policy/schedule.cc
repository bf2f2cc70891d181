// Recording, replaying and relearning the step order.
#include "lib/policy/schedule.h"

#include <algorithm>
#include <iterator>

namespace tiermem {

void Schedule::Adopt(std::vector<Use> uses) {
  uses_ = std::move(uses);
  released_by_.assign(uses_.size(), kHeld);
  positions_.clear();
  for (uint32_t i = 0; i < uses_.size(); ++i) positions_[uses_[i].key].push_back(i);
}

void Schedule::BeginStep() {
  if (in_step_) EndStep();  // a step_begin without step_end closes the previous step
  in_step_ = true;
  departed_ = false;
  pos_ = 0;
  recording_.clear();
  recorded_releases_.clear();
  last_recorded_.clear();
}

void Schedule::EndStep() {
  if (!in_step_) return;
  const uint64_t len = uses_.size();
  bool recorded = !uses_.empty() && !departed_ && pos_ == uses_.size();  // followed it
  if (!recorded) {
    // A step with no uses at all (a CPU Adam step alone: its pipeline's reads are its own) keeps
    // the schedule: it neither departed from it nor replaced it.
    if (!uses_.empty() && !recording_.empty()) ++relearned_;
    recorded = !recording_.empty();
    if (recorded) Adopt(std::move(recording_));
  }
  // The step just recorded says best where the acquires of this order end (a step that followed
  // an order set within it recorded more uses than the order has: its releases do not align).
  if (recorded && recorded_releases_.size() == uses_.size()) {
    released_by_ = std::move(recorded_releases_);
  }
  base_ += len;
  pos_ = 0;
  in_step_ = false;
  recording_.clear();
  recorded_releases_.clear();
  last_recorded_.clear();
}

void Schedule::Set(std::vector<Use> uses) {
  base_ += pos_;
  pos_ = 0;
  Adopt(std::move(uses));
}

void Schedule::OnUse(uint64_t key, tm_tier tier, bool fill, uint64_t bytes) {
  if (!in_step_) return;
  last_recorded_[key] = static_cast<uint32_t>(recording_.size());
  recording_.push_back({key, tier, fill, bytes});
  recorded_releases_.push_back(kHeld);
  if (uses_.empty()) return;
  if (pos_ < uses_.size() && uses_[pos_].key == key) {
    ++pos_;
    return;
  }
  // Off the schedule: resynchronize on the key's next use if it has one in this step.
  departed_ = true;
  auto it = positions_.find(key);
  if (it == positions_.end()) return;
  auto next = std::lower_bound(it->second.begin(), it->second.end(), pos_);
  if (next != it->second.end()) pos_ = *next + 1;
}

void Schedule::OnRelease(uint64_t key) {
  if (!in_step_) return;
  auto it = last_recorded_.find(key);
  if (it == last_recorded_.end()) return;  // acquired before this step began
  uint32_t& released = recorded_releases_[it->second];
  if (released == kHeld) released = static_cast<uint32_t>(recording_.size());
}

uint64_t Schedule::ReleasedBy(uint64_t key) const {
  auto it = positions_.find(key);
  if (it == positions_.end()) return kNever;
  auto next = std::lower_bound(it->second.begin(), it->second.end(), pos_);
  if (next == it->second.begin()) return kNever;  // not acquired earlier in this step
  const uint32_t released = released_by_[*std::prev(next)];
  return released == kHeld ? kNever : base_ + released;
}

std::vector<std::pair<uint64_t, Schedule::Use>> Schedule::Upcoming(size_t n) const {
  std::vector<std::pair<uint64_t, Use>> out;
  if (uses_.empty()) return out;
  n = std::min(n, uses_.size());
  for (size_t k = 0; k < n; ++k) {
    out.emplace_back(base_ + pos_ + k, uses_[(pos_ + k) % uses_.size()]);
  }
  return out;
}

uint64_t Schedule::NextUse(uint64_t key) const {
  auto it = positions_.find(key);
  if (it == positions_.end()) return kNever;
  auto next = std::lower_bound(it->second.begin(), it->second.end(), pos_);
  if (next != it->second.end()) return base_ + *next;
  return base_ + uses_.size() + it->second.front();  // in the next step
}

}  // namespace tiermem
