// The tensor operations of the C API: create, destroy, acquire, release, sync, residency and
// the counters.
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
    largest = std::max(largest, tiers_->space(static_cast<tm_tier>(tier)).capacity());
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
  t->home = desc.home_tier == TM_TIER_BY_PLACEMENT ? HomeOf(desc.cls)
                                                   : static_cast<tm_tier>(desc.home_tier);
  MutexLock lock(&mu_);
  Tensor* raw = t.get();
  uint64_t handle = tensors_.Insert(std::move(t));
  raw->handle = handle;
  raw->name = desc.name.empty()
                  ? absl::StrFormat("tensor-%08x", static_cast<uint32_t>(handle >> 32))
                  : desc.name;
  raw->key = KeyFor(desc, handle);
  keyed_[raw->key] = handle;  // the newest tensor of a key is the one its uses name
  return handle;
}

absl::Status Runtime::DestroyTensor(uint64_t handle) {
  MutexLock lock(&mu_);
  // A copy still landing is not waited for on the host: its memory is freed once it has landed
  // (a deferred free, as for callers' streams), and its outcome no longer matters.
  auto t = Claim(handle, /*land=*/false);
  if (!t.ok()) return t.status();
  if (auto s = CheckOthersUnpinned(**t, -1); !s.ok()) return WithContext(s, "cannot destroy");
  if ((*t)->landing.has_value()) {
    (*t)->copy((*t)->landing_tier).uses.push_back((*t)->landing->fence);
    (*t)->landing.reset();
  }
  for (int i = 0; i < TM_TIER_COUNT; ++i) FreeCopy(**t, static_cast<tm_tier>(i));
  if (auto it = keyed_.find((*t)->key); it != keyed_.end() && it->second == handle) {
    keyed_.erase(it);
  }
  // Its queued moves find no tensor and are dropped; its kept failures stay until reported.
  tensors_.Remove(handle);
  parked_offloads_.erase(handle);
  if (!parked_offloads_.empty()) RequeueParkedOffloads(std::nullopt);  // its room is free now
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Runtime::TensorBytes(uint64_t handle) {
  MutexLock lock(&mu_);
  auto t = Find(handle);
  if (!t.ok()) return t.status();
  return (*t)->bytes;
}

namespace {
// An acquire finds the copy in `tier` in place: valid, or held for writing there (a nested
// acquire), with nothing of the tensor moving.
bool InPlace(const Tensor& t, tm_tier tier) {
  const CopyState state = t.copy(tier).state;
  return (state == CopyState::kValid || state == CopyState::kWriting) && !t.busy();
}
}  // namespace

absl::StatusOr<void*> Runtime::Acquire(uint64_t handle, tm_tier tier, tm_access access,
                                       void* stream) {
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("acquire needs tier hbm or dram, not %d: NVMe copies have no "
                                 "address",
                                 static_cast<int>(tier)));
  }
  if (access < 0 || access >= TM_ACCESS_COUNT) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("access mode %d is out of range", static_cast<int>(access)));
  }
  // Recorded before anything else: the move below is ordered after the caller's work so far.
  CallerStream caller{stream, nullptr};
  if (stream != nullptr) {
    auto fence = StreamFence(stream, "tm_tensor_acquire");
    if (!fence.ok()) return fence.status();
    caller.fence = *std::move(fence);
  }
  const Trace::Clock::time_point start = Trace::Clock::now();
  MutexLock lock(&mu_);
  // A hit: the copy is in place and nothing of the tensor is moving. Only a miss may need room,
  // and takes the room token before claiming the tensor.
  Tensor* first = tensors_.Find(handle);
  const bool hit = first != nullptr && InPlace(*first, tier);
  // Busy (an offload writing it down, say): said, so that the offload leaves its HBM copy.
  const bool waits = tier == TM_TIER_HBM && first != nullptr && first->busy();
  if (waits) ++wanted_in_hbm_[handle];
  std::optional<RoomScope> room;
  if (!hit) room.emplace(*this, handle);
  auto claimed = Claim(handle);
  if (waits && --wanted_in_hbm_[handle] == 0) wanted_in_hbm_.erase(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  const bool writes = access != TM_ACCESS_READ;
  if (writes) {
    if (auto s = CheckNotHeld(t, "acquire it for writing"); !s.ok()) return s;
    if (auto s = CheckOthersUnpinned(t, tier); !s.ok())
      return WithContext(s, "cannot acquire for writing");
  }
  // Only a read may leave its copy in flight on the caller's stream: a writer frees the other
  // copies next, so its data must have landed first.
  bool made_room = false;
  absl::Status s = access == TM_ACCESS_WRITE
                       ? Reserve(t, tier, &made_room)
                       : MakeValid(t, tier, writes ? CallerStream{} : caller, Demand());
  if (!s.ok()) return s;
  // Work of callers' streams released on this copy and not yet passed: the caller's stream
  // waits for it (no host wait); without a stream the host does, since the pointer is then
  // usable at once.
  if (std::vector<io::FencePtr> uses = PendingUses(t, tier); !uses.empty()) {
    s = Unlocked(t, [&] {
      for (const io::FencePtr& f : uses) {
        absl::Status w =
            stream != nullptr ? mover_->copy_engine().StreamWait(stream, f) : f->Wait();
        if (!w.ok()) return Retag(w, TM_ERR_DEVICE);
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (tier == TM_TIER_DRAM && access != TM_ACCESS_WRITE) NoteCleanDramAcquire(t, start);
  if (writes) {
    DropOthers(t, tier);
    t.PinWrite(tier);
  }
  ++t.copy(tier).pins;
  ++counters_.acquires;
  if (access == TM_ACCESS_WRITE ? !made_room : hit) {  // a write moves nothing in: no room made
    ++counters_.hits;
  } else {
    ++counters_.misses;
    const Trace::Clock::time_point end = Trace::Clock::now();
    counters_.stall_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
    trace_->Add(Trace::kAcquire, t.name, start, end, t.bytes);
  }
  room.reset();
  NoteUse(t, tier, access != TM_ACCESS_WRITE);
  return static_cast<void*>(tiers_->Address(tier, t.copy(tier).extent));
}

absl::Status Runtime::Release(uint64_t handle, tm_tier tier) {
  return ReleaseOnStream(handle, tier, nullptr);
}

absl::Status Runtime::ReleaseOnStream(uint64_t handle, tm_tier tier, void* stream) {
  if (!ValidTier(tier)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tier %d is out of range", static_cast<int>(tier)));
  }
  // With a stream: whatever it still does with the memory, tiermem waits for before touching
  // it (a fence recorded now, before the lock; the host does not wait).
  auto fence = StreamFence(stream, "tm_tensor_release_on_stream");
  if (!fence.ok()) return fence.status();
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  Tensor& t = **found;
  TensorCopy& c = t.copy(tier);
  if (c.pins == 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("tensor \"%s\" is not acquired in %s",
                                                          t.name, tm_tier_name(tier)));
  }
  if (*fence != nullptr) c.uses.push_back(*std::move(fence));
  if (--c.pins == 0) {
    if (FindKey(t.key) == &t) schedule_.OnRelease(t.key);
    if (c.state == CopyState::kWriting) t.UnpinWrite(tier);
    if (!parked_offloads_.empty()) RequeueParkedOffloads(tier);  // room there may help them
    changed_.SignalAll();  // a demand waiting for room may now evict it
  }
  return absl::OkStatus();
}

absl::Status Runtime::Sync(uint64_t handle) {
  MutexLock lock(&mu_);
  for (;;) {
    auto found = Find(handle);
    if (!found.ok()) return found.status();
    if (auto s = NotBusyByThisThread(**found); !s.ok()) return s;
    if ((*found)->queued == 0 && !(*found)->busy()) break;
    changed_.Wait(&mu_);
  }
  RunParkedOffload(handle);      // its failure, if any, is kept below
  auto claimed = Claim(handle);  // also lands a stream-ordered copy
  if (!claimed.ok()) return claimed.status();
  ReapCallerCopies(handle, true);
  deferred_.ReapAll(*tiers_);
  return failures_.Take(handle);
}

absl::Status Runtime::SyncAll() {
  MutexLock lock(&mu_);
  // Parked offloads run here, one at a time; a release meanwhile may queue the others again,
  // so the queue is waited for again after each (a parked one run here never parks again).
  for (;;) {
    while (jobs_.outstanding() > 0) changed_.Wait(&mu_);
    if (parked_offloads_.empty()) break;
    RunParkedOffload(parked_offloads_.begin()->first);
  }
  ReapCallerCopies(0, true);
  SettleDeferred();
  return failures_.Take(0);
}

absl::StatusOr<uint32_t> Runtime::Residency(uint64_t handle) {
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  return (*found)->ResidencyMask();
}

tm_stats Runtime::Stats() {
  tm_stats s = TM_STATS_INIT;
  for (int t = 0; t < TM_TIER_COUNT; ++t)
    s.tiers[t] = tiers_->space(static_cast<tm_tier>(t)).Stats();
  for (int f = 0; f < TM_TIER_COUNT; ++f) {
    for (int t = 0; t < TM_TIER_COUNT; ++t) s.bytes_moved[f][t] = mover_->moved(f, t);
  }
  MutexLock lock(&mu_);
  counters_.Fill(s);
  s.tensors = tensors_.size();
  s.schedule_length = schedule_.size();
  s.schedule_relearned = schedule_.relearned();
  return s;
}

uint64_t Runtime::MoveWaits() {
  MutexLock lock(&mu_);
  return counters_.move_waits;
}

}  // namespace tiermem
