// The runtime's components that need more than their header: the failure log and the deferred
// frees.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/deferred_frees.h"
#include "lib/runtime/failure_log.h"

namespace tiermem {

absl::Status FailureLog::Take(uint64_t handle) {
  absl::Status first;
  int failed = 0;
  bool kept = true;
  std::erase_if(failures_, [&](Failure& f) {
    if (handle != 0 && f.handle != handle) return false;
    if (failed++ == 0) first = std::move(f.status);
    kept = kept && f.kept;
    return true;
  });
  if (failed == 0) return first;
  if (failed > 1) {
    first = WithContext(first, absl::StrFormat("%d asynchronous moves failed; the first", failed));
  }
  if (!kept) return first;
  return MarkNothingLost(
      Error(ToTmStatus(first),
            absl::StrCat(first.message(), failed > 1 ? " (each of these moves" : " (the move",
                         " left its tensor valid where it was: nothing was lost)")));
}

bool DeferredFrees::Reap(Tiers& tiers, tm_tier tier) {
  bool remain = false;
  std::erase_if(deferred_, [&](Deferred& d) {
    std::erase_if(d.uses, [](const io::FencePtr& f) { return f->Passed(); });
    if (!d.uses.empty()) {
      remain |= d.tier == tier;
      return false;
    }
    tiers.space(d.tier).Free(d.extent);
    return true;
  });
  return remain;
}

bool DeferredFrees::ReleaseHandedOn(Tiers& tiers, tm_tier tier) {
  const size_t before = deferred_.size();
  std::erase_if(deferred_, [&](Deferred& d) {
    if (!d.handed_on || d.tier != tier) return false;
    tiers.space(d.tier).Free(d.extent);
    return true;
  });
  return deferred_.size() != before;
}

std::vector<io::FencePtr> DeferredFrees::Fences() const {
  std::vector<io::FencePtr> fences;
  for (const Deferred& d : deferred_) fences.insert(fences.end(), d.uses.begin(), d.uses.end());
  return fences;
}

}  // namespace tiermem
