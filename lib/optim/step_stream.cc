// The step's NVMe state streamed through DRAM: each bucket read (ahead, while the one before
// steps), stepped into its shadow version and written back behind, in a window sized to the
// DRAM tier.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/optim/step.h"

namespace tiermem::optim::internal {

absl::StatusOr<uint64_t> Step::ShadowOf(size_t k) {
  const uint64_t t = buckets_[k].state.bits;
  if (auto it = versions_.shadow_of.find(t); it != versions_.shadow_of.end()) return it->second;
  auto bytes = tensors_.Bytes(t);
  if (!bytes.ok()) return bytes.status();
  auto shadow = tensors_.Create(*bytes, absl::StrFormat("cpu_adam shadow %016x", t));
  if (!shadow.ok()) return shadow.status();
  versions_.shadow_of[t] = *shadow;
  return *shadow;
}

// Reads bucket k's state (in DRAM, read-only), steps it into its shadow's DRAM copy and queues
// the shadow's write to NVMe; the updated parameter goes to `staged`.
absl::Status Step::StepIntoShadow(size_t k, char* staged) {
  const uint64_t t = buckets_[k].state.bits;
  auto shadow = ShadowOf(k);
  if (!shadow.ok()) return InBucket(shadow.status(), Name(k), "creating its shadow state");
  // Waits for the bucket's prefetch and takes its failure, if any: the acquire reads again,
  // and reports the failure if it persists.
  (void)tensors_.Sync(t);
  auto src = tensors_.Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ);
  if (!src.ok()) return InBucket(src.status(), Name(k), "reading its state into DRAM");
  auto dst = tensors_.Acquire(*shadow, TM_TIER_DRAM, TM_ACCESS_WRITE);
  if (!dst.ok()) {
    (void)tensors_.Release(t, TM_TIER_DRAM);
    return InBucket(dst.status(), Name(k), "making room for its new state in DRAM");
  }
  const BucketGroup& group = GroupOf(k);
  AdamSpan span = SpanOver(buckets_[k], *dst, group.hyper.amsgrad);
  span.src = static_cast<const float*>(*src);
  if (span.out != nullptr && !out_now_) span.out = staged;
  absl::Status stepped = opt_.StepWith(group.hyper, group.step, grad_scale_, &span, 1);
  absl::Status released = tensors_.Release(*shadow, TM_TIER_DRAM);
  absl::Status released_src = tensors_.Release(t, TM_TIER_DRAM);
  if (!stepped.ok()) return InBucket(stepped, Name(k), "step");  // checked first: only a bug
  if (!released.ok()) return InBucket(released, Name(k), "release");
  if (!released_src.ok()) return InBucket(released_src, Name(k), "release");
  // The old version's DRAM copy is spent (NVMe holds its bytes): dropped now, before the next
  // prefetch needs its room. Left to eviction, it would outlive the buckets read ahead, which
  // were touched less recently, and those would be dropped instead and read twice. (An offload
  // would not do: inclusive DRAM keeps a clean copy while there is room.) A failure is no
  // failure of the step.
  (void)tensors_.DropClean(t);
  // Returns at once: the write runs while the next bucket steps.
  if (absl::Status s = tensors_.Offload(*shadow, TM_TIER_NVME); !s.ok()) {
    return InBucket(s, Name(k), "writing its new state to NVMe");
  }
  swaps_.emplace_back(t, *shadow);
  return absl::OkStatus();
}

// The step's footprint in DRAM is kept under a share of the DRAM tier's budget (what the DRAM
// state stepped in place leaves of it): the bucket stepping (its state and its new version), the
// states read ahead, and the new versions still being written. The rest is left to other
// tensors and to the holes between pinned copies: a copy needs one hole of its size.
uint64_t Step::WindowLimit() {
  auto capacity = tensors_.DramCapacity();
  if (!capacity.ok()) return UINT64_MAX;  // unknown: the prefetch depth alone bounds it
  const uint64_t free = *capacity > dram_pinned_bytes_ ? *capacity - dram_pinned_bytes_ : 0;
  return free / 2;
}

absl::Status Step::NeedsMoreRoom(const absl::Status& failed, size_t j) {
  const uint64_t b = state_bytes_[j];
  auto capacity = tensors_.DramCapacity();
  return Error(
      ToTmStatus(failed),
      absl::StrFormat("%s (%s: this bucket needs %s of DRAM at once, its state and its new "
                      "version, each in one piece%s; the step waited for every copy it had "
                      "in flight and went on serially, and still found no room: give the DRAM "
                      "tier more, or split the bucket's state in smaller buckets (tiermem.torch's "
                      "optimizers step big tensors in slices))",
                      failed.message(), Name(nvme_[j]), HumanBytes(2 * b),
                      capacity.ok()
                          ? absl::StrFormat("; the DRAM tier holds %s, %s of it pinned "
                                            "by state stepped in place",
                                            HumanBytes(*capacity), HumanBytes(dram_pinned_bytes_))
                          : ""));
}

// Waits for every copy the pipeline has in flight and lets go of the states read ahead, so
// that the bucket stepping has the DRAM to itself (but for other tensors' pinned copies).
absl::Status Step::Drain(size_t j, size_t* synced) {
  for (; *synced < j; ++*synced) {
    if (absl::Status s = tensors_.Sync(swaps_[*synced].second); !s.ok()) {
      return InBucket(s, Name(nvme_[*synced]), "writing its new state to NVMe");
    }
    Written(*synced);
  }
  for (size_t k = j + 1; k < prefetched_ && k < nvme_.size(); ++k) {
    const uint64_t t = buckets_[nvme_[k]].state.bits;
    (void)tensors_.Sync(t);  // a failed read shows again at the bucket's acquire
    (void)tensors_.DropClean(t);
  }
  prefetched_ = j + 1;
  return absl::OkStatus();
}

// A new version known written. State that DRAM cannot keep from one step to the next streams
// through it: the clean copy the write leaves in DRAM (inclusive DRAM keeps one) is then only in
// the way. Left to eviction, it would outlive the states read ahead, which were touched less
// recently, and those would be dropped instead and read twice.
void Step::Written(size_t j) {
  if (!streaming_) return;
  (void)tensors_.DropClean(swaps_[j].second);
}

absl::Status Step::StepNvmeState(int prefetch_depth) {
  size_t depth = static_cast<size_t>(std::max(0, prefetch_depth));
  const uint64_t limit = WindowLimit();
  absl::Status status;
  // New versions being written, at most: as many as the buckets read ahead, and one more, and
  // fewer where the window would pass its limit. The disk is the bottleneck here, so the step
  // waits for the oldest write rather than let new versions pile up in DRAM: a demand for room
  // drops clean copies before it waits for writes, and the clean copies in DRAM are the
  // buckets read ahead, which would be read again.
  size_t synced = 0;     // positions of nvme_ whose new version is known written
  uint64_t writing = 0;  // bytes of new versions written behind, not yet waited for
  uint64_t ahead = 0;    // bytes of states read ahead
  uint64_t total = 0;
  for (uint64_t b : state_bytes_) total += b;
  state_end_ = state_before_ + total;
  streaming_ = state_end_ > limit;
  for (size_t j = 0; j < nvme_.size() && status.ok(); ++j) {
    const uint64_t here = 2 * state_bytes_[j];
    if (j < prefetched_ && j > 0) ahead -= std::min(ahead, state_bytes_[j]);
    while (synced < j && (j - synced > depth || writing + ahead + here > limit)) {
      absl::Status s = tensors_.Sync(swaps_[synced].second);
      if (!s.ok()) {
        status = InBucket(s, Name(nvme_[synced]), "writing its new state to NVMe");
        break;
      }
      Written(synced);
      writing -= state_bytes_[synced++];
    }
    if (!status.ok()) break;
    const size_t want = std::min(nvme_.size(), j + 1 + depth);
    for (prefetched_ = std::max(prefetched_, j + 1); prefetched_ < want; ++prefetched_) {
      if (writing + ahead + here + state_bytes_[prefetched_] > limit) break;
      // A hint: a failed read shows again at the bucket's acquire, which reports it.
      (void)tensors_.Prefetch(buckets_[nvme_[prefetched_]].state.bits, TM_TIER_DRAM);
      ahead += state_bytes_[prefetched_];
    }
    char* staged = versions_.staged_out.data() + staged_at_[j];
    status = StepIntoShadow(nvme_[j], staged);
    if (ToTmStatus(status) == TM_ERR_OUT_OF_MEMORY) {
      // No room beside the copies in flight: wait for them all, and go on serially.
      if (absl::Status s = Drain(j, &synced); !s.ok()) {
        status = s;
        break;
      }
      writing = ahead = 0;
      depth = 0;
      status = StepIntoShadow(nvme_[j], staged);
      if (ToTmStatus(status) == TM_ERR_OUT_OF_MEMORY) status = NeedsMoreRoom(status, j);
    }
    if (status.ok()) writing += state_bytes_[j];
  }
  // Every new version is on NVMe before any is swapped in.
  for (size_t j = synced; j < swaps_.size(); ++j) {
    absl::Status s = tensors_.Sync(swaps_[j].second);
    if (!s.ok() && status.ok()) {
      status = InBucket(s, Name(nvme_[j]), "writing its new state to NVMe");
    }
    if (s.ok()) Written(j);
  }
  return status;
}

}  // namespace tiermem::optim::internal
