// DLPack exports (tm_tensor_acquire_dlpack): the release that belongs to an export's deleter, and
// the tensor destroyed while exports still pin it (an orphan), freed by the last deleter.
#include <utility>

#include "absl/strings/str_format.h"
#include "io/log.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"

namespace tiermem {

absl::Status Runtime::ReleaseExport(uint64_t handle, tm_tier tier, void* stream) {
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tier %d holds no DLPack export", static_cast<int>(tier)));
  }
  // Whatever the stream still does with the memory, tiermem waits for (recorded before the lock).
  auto fence = copies_.StreamFence(stream, "a DLPack export's deleter");
  CoreLock lock(core_);
  Tensor* t = core_.Lookup(handle);  // an orphan too
  if (t == nullptr || t->copy(tier).exports == 0) {
    return Error(TM_ERR_INVALID_HANDLE,
                 absl::StrFormat("no DLPack export of tensor handle 0x%016x in %s is out", handle,
                                 tm_tier_name(tier)));
  }
  if (!fence.ok()) {
    // The stream's work may still use the memory and cannot be waited for: the pin stays (the
    // memory goes with the runtime) rather than hand the memory on under it.
    io::Log(io::LogSeverity::kWarn,
            "tensor \"%s\": a DLPack export's deleter keeps its %s copy pinned: %s",
            t->name.c_str(), tm_tier_name(tier), std::string(fence.status().message()).c_str());
    return fence.status();
  }
  --t->copy(tier).exports;
  Unpin(*t, tier, *std::move(fence));
  if (t->orphaned && !t->pinned()) {
    prefetcher_.NoteOrphanRelease(*t);
    Free(*t);
  }
  return absl::OkStatus();
}

uint64_t Runtime::ExportsOut() {
  CoreLock lock(core_);
  return CountExports();
}

uint64_t Runtime::CountExports() {
  uint64_t n = 0;
  core_.ForEachTensor([&](Tensor& t) {
    for (const TensorCopy& c : t.copies) n += c.exports;
  });
  return n;
}

void Runtime::Orphan(Tensor& t) {
  t.orphaned = true;
  prefetcher_.Forget(t.key, t.handle);  // no prefetch of it; its key is free for a new tensor
  movers_.Forget(t.handle);
  // The copies no export pins are freed now (a landing one's memory once it has landed).
  if (t.landing.has_value() && t.copy(t.landing_tier).pins == 0) {
    t.copy(t.landing_tier).uses.push_back(t.landing->fence);
    t.landing.reset();
  }
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    const auto tier = static_cast<tm_tier>(i);
    if (t.copy(tier).pins == 0) core_.FreeCopy(t, tier);
  }
  core_.NotifyChanged();
}

}  // namespace tiermem
