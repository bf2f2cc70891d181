// The tensor operations of the C API: create, destroy, acquire, release, sync, residency and
// the counters, every part's added up.
#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {
namespace {

bool ValidTier(int tier) { return tier >= 0 && tier < TM_TIER_COUNT; }

}  // namespace

absl::StatusOr<uint64_t> Runtime::CreateTensor(const TensorDesc& desc) {
  if (desc.bytes == 0) return Error(TM_ERR_INVALID_ARGUMENT, "a tensor needs at least 1 byte");
  // A tensor larger than every tier could never hold a copy anywhere; near 2^64 its size would
  // also wrap the round-ups of the allocator and the movers (it once aliased another tensor).
  uint64_t largest = 0;
  for (int tier = 0; tier < TM_TIER_COUNT; ++tier) {
    largest = std::max(largest, core_.tiers()->space(static_cast<tm_tier>(tier)).capacity());
  }
  if (desc.bytes > largest) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tensor \"%s\" of %llu bytes is larger than every tier (the "
                                 "largest holds %llu bytes): it could never be placed",
                                 desc.name, static_cast<unsigned long long>(desc.bytes),
                                 static_cast<unsigned long long>(largest)));
  }
  if (desc.cls < 0 || desc.cls >= TM_CLASS_COUNT) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tensor class %d is out of range", desc.cls));
  }
  if (desc.home_tier != TM_TIER_BY_PLACEMENT && !ValidTier(desc.home_tier)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("home tier %d is out of range", desc.home_tier));
  }
  auto t = std::make_unique<Tensor>();
  t->bytes = desc.bytes;
  t->cls = desc.cls;
  t->home = desc.home_tier == TM_TIER_BY_PLACEMENT ? prefetcher_.HomeOf(desc.cls)
                                                   : static_cast<tm_tier>(desc.home_tier);
  CoreLock lock(core_);
  Tensor* raw = t.get();
  uint64_t handle = core_.AddTensor(std::move(t));
  raw->handle = handle;
  raw->name = desc.name.empty()
                  ? absl::StrFormat("tensor-%08x", static_cast<uint32_t>(handle >> 32))
                  : desc.name;
  raw->key = prefetcher_.Register(desc, handle);
  return handle;
}

absl::Status Runtime::DestroyTensor(uint64_t handle) {
  CoreLock lock(core_);
  // A copy still landing is not waited for on the host: its memory is freed once it has landed
  // (a deferred free, as for callers' streams), and its outcome no longer matters.
  auto t = core_.Claim(handle, /*land=*/false);
  if (!t.ok()) return t.status();
  Tensor& x = **t;
  bool exported = false, only_exports = true;
  for (const TensorCopy& c : x.copies) {
    exported = exported || c.exports > 0;
    only_exports = only_exports && c.pins == c.exports;
  }
  if (exported && only_exports && x.held_by_step == std::thread::id{}) {
    Orphan(x);  // its DLPack exports' deleters free it
    return absl::OkStatus();
  }
  if (auto s = core_.CheckOthersUnpinned(x, -1); !s.ok()) return WithContext(s, "cannot destroy");
  if (auto s = core_.CheckNotHeld(x, "destroy it"); !s.ok()) return s;
  Free(x);
  return absl::OkStatus();
}

void Runtime::Free(Tensor& t) {
  if (t.landing.has_value()) {
    t.copy(t.landing_tier).uses.push_back(t.landing->fence);
    t.landing.reset();
  }
  for (int i = 0; i < TM_TIER_COUNT; ++i) core_.FreeCopy(t, static_cast<tm_tier>(i));
  const uint64_t handle = t.handle;
  if (!t.orphaned) prefetcher_.Forget(t.key, handle);  // an orphan's key went before
  // Its queued moves find no tensor and are dropped; its kept failures stay until reported.
  core_.RemoveTensor(handle);
  movers_.Forget(handle);
  core_.NotifyChanged();
}

absl::StatusOr<uint64_t> Runtime::TensorBytes(uint64_t handle) {
  CoreLock lock(core_);
  auto t = core_.Find(handle);
  if (!t.ok()) return t.status();
  return (*t)->bytes;
}

namespace {
// An acquire finds the copy in `tier` in place: valid, or held for writing there (a nested
// acquire), with nothing of the tensor moving.
// In place: valid, or landing (a prefetch started on a caller's thread, a stream-ordered copy:
// the claim waits for its ticket), and nothing of the tensor moving.
bool InPlace(const Tensor& t, tm_tier tier) {
  const CopyState state = t.copy(tier).state;
  return (state == CopyState::kValid || state == CopyState::kWriting ||
          state == CopyState::kLanding) &&
         !t.busy();
}
// An acquire's tier and access mode: only HBM and DRAM copies have an address.
absl::Status CheckAcquireArguments(tm_tier tier, tm_access access) {
  if (tier == TM_TIER_NVME) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 "acquire needs tier hbm or dram, not nvme: NVMe copies have no address");
  }
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("acquire: tier %d is not a tier (TM_TIER_HBM or TM_TIER_DRAM)",
                                 static_cast<int>(tier)));
  }
  if (access < 0 || access >= TM_ACCESS_COUNT) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("access mode %d is out of range", static_cast<int>(access)));
  }
  return absl::OkStatus();
}

// Acquire's claim. A hit (the copy in place, landing included, and nothing of the tensor moving)
// claims the tensor at once; a miss may need room and takes the room token first. A read on a
// caller's stream of a copy landing in HBM (a prefetch started on a caller's thread) is claimed
// without landing it: *on_stream says that the caller's stream must wait for it instead of the
// host. Any other landing copy is waited for.
absl::StatusOr<Tensor*> ClaimForAcquire(Core& core, uint64_t handle, tm_tier tier, bool stream_read,
                                        std::optional<RoomScope>& room, bool* hit, bool* on_stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(runtime_lock) {
  Tensor* first = core.Lookup(handle);
  *hit = first != nullptr && InPlace(*first, tier);
  // Busy (an offload writing it down, say): said, so that the offload leaves its HBM copy.
  const bool waits = tier == TM_TIER_HBM && first != nullptr && first->busy();
  if (waits) core.WantInHbm(handle);
  if (!*hit) room.emplace(core, handle);
  const bool ordered = *hit && stream_read && tier == TM_TIER_HBM;
  auto claimed = core.Claim(handle, /*land=*/!ordered);
  if (ordered && claimed.ok() && (*claimed)->landing.has_value() &&
      ((*claimed)->landing_tier != tier || (*claimed)->landing_own)) {
    claimed = core.Claim(handle);  // landing elsewhere: the host waits for it
  }
  if (*hit && claimed.ok() && !InPlace(**claimed, tier)) {
    // Its landing copy failed (recorded): a miss after all, which takes the room token first.
    room.emplace(core, handle);
    claimed = core.Claim(handle);
  }
  if (waits) core.UnwantInHbm(handle);
  *on_stream = ordered && claimed.ok() && (*claimed)->landing.has_value();
  return claimed;
}

}  // namespace

absl::StatusOr<void*> Runtime::Acquire(uint64_t handle, tm_tier tier, tm_access access,
                                       void* stream, bool for_export, bool scheduled) {
  if (auto s = CheckAcquireArguments(tier, access); !s.ok()) return s;
  // Recorded before anything else: the move below is ordered after the caller's work so far.
  CallerStream caller{stream, nullptr};
  if (stream != nullptr) {
    auto fence = copies_.StreamFence(stream, "tm_tensor_acquire");
    if (!fence.ok()) return fence.status();
    caller.fence = *std::move(fence);
  }
  const Trace::Clock::time_point start = Trace::Clock::now();
  CoreLock lock(core_);
  std::optional<RoomScope> room;
  bool hit = false, on_stream = false;
  auto claimed = ClaimForAcquire(core_, handle, tier, stream != nullptr && access == TM_ACCESS_READ,
                                 room, &hit, &on_stream);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (on_stream) {  // the caller's stream waits for the landing copy; the host does not
    if (absl::Status w = core_.mover()->copy_engine().StreamWait(stream, t.landing->fence); !w.ok())
      return Retag(w, TM_ERR_DEVICE);
  }
  const bool writes = access != TM_ACCESS_READ;
  if (writes) {
    if (auto s = core_.CheckNotHeld(t, "acquire it for writing"); !s.ok()) return s;
    if (auto s = core_.CheckOthersUnpinned(t, tier); !s.ok())
      return WithContext(s, "cannot acquire for writing");
  }
  // Only a read may leave its copy in flight on the caller's stream: a writer frees the other
  // copies next, so its data must have landed first.
  bool made_room = false;
  absl::Status s = access == TM_ACCESS_WRITE
                       ? moves_.Reserve(t, tier, &made_room)
                       : moves_.MakeValid(t, tier, writes ? CallerStream{} : caller, Demand());
  if (!s.ok()) return s;
  // Work of callers' streams released on this copy and not yet passed: the caller's stream
  // waits for it (no host wait); without a stream the host does, since the pointer is then
  // usable at once.
  if (std::vector<io::FencePtr> uses = core_.PendingUses(t, tier); !uses.empty()) {
    s = core_.Unlocked(t, [&] {
      for (const io::FencePtr& f : uses) {
        absl::Status w =
            stream != nullptr ? core_.mover()->copy_engine().StreamWait(stream, f) : f->Wait();
        if (!w.ok()) return Retag(w, TM_ERR_DEVICE);
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (tier == TM_TIER_DRAM && access != TM_ACCESS_WRITE)
    write_through_.NoteCleanDramAcquire(t, start);
  if (writes) {
    core_.DropOthers(t, tier);
    t.PinWrite(tier);
  }
  ++t.copy(tier).pins;
  if (for_export) ++t.copy(tier).exports;
  ++counters_.acquires;
  if (access == TM_ACCESS_WRITE ? !made_room : hit) {  // a write moves nothing in: no room made
    ++counters_.hits;
  } else {
    ++counters_.misses;
    const Trace::Clock::time_point end = Trace::Clock::now();
    counters_.stall_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
    core_.trace()->Add(Trace::kAcquire, t.name, start, end, t.bytes);
  }
  room.reset();
  void* address = core_.tiers()->Address(tier, t.copy(tier).extent);
  if (scheduled) {
    NoteUseAndStart(t, tier, access != TM_ACCESS_WRITE);
  } else {
    prefetcher_.NoteUnscheduledUse(t);
  }
  return address;
}

void Runtime::NoteUseAndStart(Tensor& t, tm_tier tier, bool fill) {
  // Small prefetches up from DRAM start here, their copies only enqueued, rather than by a
  // mover: waking one would cost this thread more than the copy (Prefetcher::Start).
  std::vector<Prefetcher::Start> starts;
  prefetcher_.NoteUse(t, tier, fill, &starts);
  for (const Prefetcher::Start& st : starts) {
    Tensor* v = core_.Lookup(st.handle);
    if (v != nullptr && !moves_.StartPrefetch(*v, st.horizon)) prefetcher_.Queue(st);
  }
}

absl::Status Runtime::Release(uint64_t handle, tm_tier tier) {
  return ReleaseOnStream(handle, tier, nullptr);
}

absl::Status Runtime::ReleaseOnStream(uint64_t handle, tm_tier tier, void* stream) {
  return ReleaseCaller(handle, tier, stream, /*written=*/false);
}

absl::Status Runtime::ReleaseWritten(uint64_t handle, tm_tier tier, void* stream) {
  return ReleaseCaller(handle, tier, stream, /*written=*/true);
}

absl::Status Runtime::ReleaseCaller(uint64_t handle, tm_tier tier, void* stream, bool written) {
  if (!ValidTier(tier)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tier %d is out of range", static_cast<int>(tier)));
  }
  // With a stream: whatever it still does with the memory, tiermem waits for before touching
  // it (a fence recorded now, before the lock; the host does not wait).
  auto fence = copies_.StreamFence(
      stream, written ? "tm_tensor_release_written" : "tm_tensor_release_on_stream");
  if (!fence.ok()) return fence.status();
  CoreLock lock(core_);
  auto found = core_.Find(handle);
  if (!found.ok()) return found.status();
  Tensor& t = **found;
  TensorCopy& c = t.copy(tier);
  if (c.pins == 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("tensor \"%s\" is not acquired in %s",
                                                          t.name, tm_tier_name(tier)));
  }
  if (c.pins == c.exports) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tensor \"%s\" is acquired in %s only by DLPack exports: their "
                                 "deleters release them",
                                 t.name, tm_tier_name(tier)));
  }
  // Written: the copy becomes the only one, as an acquire for writing makes it (one acquired
  // for writing too is so already).
  if (written && c.state != CopyState::kWriting) {
    if (auto s = core_.CheckNotHeld(t, "release it as written"); !s.ok()) return s;
    if (auto s = core_.CheckOthersUnpinned(t, tier); !s.ok())
      return WithContext(s, "cannot release it as written");
    // A copy read on the caller's stream may still be landing: the other copies go once it has.
    if (auto s = moves_.MakeValid(t, tier, CallerStream{}, Demand()); !s.ok()) return s;
    core_.DropOthers(t, tier);
  }
  Unpin(t, tier, *std::move(fence));
  return absl::OkStatus();
}

void Runtime::Unpin(Tensor& t, tm_tier tier, io::FencePtr use) {
  TensorCopy& c = t.copy(tier);
  if (use != nullptr) c.uses.push_back(std::move(use));
  if (--c.pins == 0) {
    prefetcher_.NoteRelease(t);
    if (c.state == CopyState::kWriting) t.UnpinWrite(tier);
    movers_.RequeueParkedOffloads(tier);  // room there may help them
    core_.NotifyChanged();                // a demand waiting for room may now evict it
  }
}

absl::Status Runtime::Sync(uint64_t handle) {
  CoreLock lock(core_);
  for (;;) {
    auto found = core_.Find(handle);
    if (!found.ok()) return found.status();
    if (auto s = core_.NotBusyByThisThread(**found); !s.ok()) return s;
    if ((*found)->queued == 0 && !(*found)->busy()) break;
    core_.WaitForChange();
  }
  movers_.RunParkedOffload(handle);    // its failure, if any, is kept below
  auto claimed = core_.Claim(handle);  // also lands a stream-ordered copy
  if (!claimed.ok()) return claimed.status();
  copies_.ReapCallerCopies(handle, true);
  core_.ReapAllDeferred();
  return core_.TakeFailure(handle);
}

absl::Status Runtime::SyncAll() {
  CoreLock lock(core_);
  movers_.Drain();
  copies_.ReapCallerCopies(0, true);
  core_.SettleDeferred();
  return core_.TakeFailure(0);
}

absl::StatusOr<uint32_t> Runtime::Residency(uint64_t handle) {
  CoreLock lock(core_);
  auto found = core_.Find(handle);
  if (!found.ok()) return found.status();
  return (*found)->ResidencyMask();
}

absl::Status Runtime::DropCleanCopy(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("a clean copy is dropped from hbm or dram, not tier %d",
                                 static_cast<int>(tier)));
  }
  CoreLock lock(core_);
  auto claimed = core_.Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  const TensorCopy& c = t.copy(tier);
  if (c.state != CopyState::kValid || c.pins > 0) return absl::OkStatus();
  bool below = false;
  for (int lower = tier + 1; lower < TM_TIER_COUNT; ++lower) {
    below = below || t.copy(static_cast<tm_tier>(lower)).state == CopyState::kValid;
  }
  if (!below) return absl::OkStatus();
  core_.FreeCopy(t, tier);
  core_.NotifyChanged();  // a demand waiting for room may now have it
  return absl::OkStatus();
}

tm_stats Runtime::Stats() {
  tm_stats s = TM_STATS_INIT;
  for (int t = 0; t < TM_TIER_COUNT; ++t)
    s.tiers[t] = core_.tiers()->space(static_cast<tm_tier>(t)).Stats();
  for (int f = 0; f < TM_TIER_COUNT; ++f) {
    for (int t = 0; t < TM_TIER_COUNT; ++t) s.bytes_moved[f][t] = core_.mover()->moved(f, t);
  }
  CoreLock lock(core_);
  Counters sum = counters_;
  for (const Counters* c : {&core_.counters(), &moves_.counters(), &room_.counters(),
                            &prefetcher_.counters(), &movers_.counters(), &copies_.counters(),
                            &recompute_.counters(), &write_through_.counters()})
    sum += *c;
  sum.Fill(s);
  s.tensors = core_.tensor_count();
  s.dlpack_exports = CountExports();
  prefetcher_.FillStats(s);
  return s;
}

uint64_t Runtime::MoveWaits() {
  CoreLock lock(core_);
  return core_.counters().move_waits;
}

}  // namespace tiermem
