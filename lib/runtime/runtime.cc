// The tensor operations of the C API, the move protocol (claim, move without the lock, commit),
// the asynchronous job queue and sync.
#include "lib/runtime/runtime.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/log.h"
#include "lib/runtime/runtime_internal.h"
#include "lib/base/status.h"

namespace tiermem {
namespace {

using io::Log;
using io::LogSeverity;

bool ValidTier(int tier) { return tier >= 0 && tier < TM_TIER_COUNT; }

}  // namespace

absl::StatusOr<Tensor*> Runtime::Find(uint64_t handle) {
  Tensor* t = tensors_.Find(handle);
  if (t == nullptr) {
    return Error(
        TM_ERR_INVALID_HANDLE,
        absl::StrFormat("tensor handle 0x%016x is zero, destroyed or of another runtime", handle));
  }
  return t;
}

Tensor* Runtime::FindKey(uint64_t key) {
  auto it = keyed_.find(key);
  return it == keyed_.end() ? nullptr : tensors_.Find(it->second);
}

void Runtime::Land(Tensor& t) {
  if (!t.landing.has_value()) return;
  const io::CopyTicket ticket = *t.landing;
  const tm_tier tier = t.landing_tier;
  absl::Status s =
      Unlocked(t, [&] { return Retag(mover_->copy_engine().Wait(ticket), TM_ERR_DEVICE); });
  const bool replaces = t.landing_replaces;
  if (s.ok()) {
    t.Landed(tier);
    if (replaces) DropOthers(t, tier);
    return;
  }
  // The copy failed: that copy never became what it claimed. A copy_in's target is kept only
  // when it is the tensor's only copy (its other bytes are still there).
  if (!replaces || t.ResidencyMask() != TM_TIER_BIT(tier)) {
    FreeCopy(t, tier);
  } else {
    t.Landed(tier);
  }
  RecordFailure(t, WithContext(s, absl::StrFormat("stream-ordered copy of tensor \"%s\" to %s",
                                                  t.name, tm_tier_name(tier))));
}

absl::StatusOr<Tensor*> Runtime::Claim(uint64_t handle, bool land) {
  for (;;) {
    auto t = Find(handle);  // again after every wait: it may have been destroyed meanwhile
    if (!t.ok()) return t.status();
    Tensor& tensor = **t;
    if (tensor.busy()) {
      changed_.Wait(&mu_);
      continue;
    }
    if (land && tensor.landing.has_value()) {
      Land(tensor);
      continue;
    }
    return &tensor;
  }
}

void Runtime::EnterRoom() {
  const std::thread::id me = std::this_thread::get_id();
  while (room_depth_ > 0 && room_owner_ != me) changed_.Wait(&mu_);
  if (room_depth_++ == 0) ++room_generation_;
  room_owner_ = me;
}

void Runtime::LeaveRoom() {
  if (--room_depth_ == 0) {
    room_owner_ = std::thread::id{};
    changed_.SignalAll();
  }
}

void Runtime::ReleaseRoom() {
  if (room_depth_ == 0 || room_owner_ != std::this_thread::get_id()) return;
  room_depth_ = 0;
  room_owner_ = std::thread::id{};
  changed_.SignalAll();
}

void Runtime::FreeCopy(Tensor& t, tm_tier tier) {
  std::vector<io::FencePtr> uses = PendingUses(t, tier);
  Extent e = t.Drop(tier);
  if (e.empty()) return;
  if (uses.empty()) {
    tiers_->space(tier).Free(e);
    return;
  }
  // Callers' work may still use the memory: it is freed once that work has passed.
  tiers_->space(tier).Disown(e);
  deferred_.push_back(Deferred{tier, e, std::move(uses)});
}

void Runtime::RecordFailure(const Tensor& t, absl::Status s) {
  ++counters_.moves_failed;
  failures_.push_back(Failure{t.handle, t.name, std::move(s)});
}

absl::Status Runtime::TakeFailures(uint64_t handle) {
  absl::Status first;
  int failed = 0;
  std::erase_if(failures_, [&](Failure& f) {
    if (handle != 0 && f.handle != handle) return false;
    if (failed++ == 0) first = std::move(f.status);
    return true;
  });
  if (failed > 1) {
    return WithContext(first, absl::StrFormat("%d asynchronous moves failed; the first", failed));
  }
  return first;
}

absl::Status Runtime::MakeValid(Tensor& t, tm_tier dst, const CallerStream& caller, Want want,
                                DropReason* why) {
  if (t.copy(dst).valid()) return absl::OkStatus();
  if (int w = t.writing_tier(); w >= 0) {
    // Copying bytes that a writer is changing would make a torn copy look valid.
    if (why != nullptr) *why = DropReason::kSuperseded;
    return Error(TM_ERR_BUSY, absl::StrFormat("tensor \"%s\" is acquired for writing in %s", t.name,
                                              tm_tier_name(static_cast<tm_tier>(w))));
  }
  BusyScope busy(t, changed_);  // for the whole move: eviction below may release the lock too
  auto extent = Allocate(t, dst, want, why);
  if (want.release_room) ReleaseRoom();  // the room is made; the move needs no token
  if (!extent.ok()) return extent.status();

  // Prepare: the nearest valid copy is the source (on a tie, the faster tier).
  MovePlan plan;
  plan.dst = dst;
  plan.bytes = t.bytes;
  plan.stream = caller.stream;
  if (caller.fence != nullptr) plan.after.push_back(caller.fence);
  if (t.materialized()) {
    for (int d = 1; d < TM_TIER_COUNT && plan.src < 0; ++d) {
      for (int cand : {static_cast<int>(dst) - d, static_cast<int>(dst) + d}) {
        if (cand >= 0 && cand < TM_TIER_COUNT && t.copies[cand].valid()) {
          plan.src = cand;
          break;
        }
      }
    }
    const tm_tier src = static_cast<tm_tier>(plan.src);
    for (io::FencePtr& f : PendingUses(t, src)) plan.after.push_back(std::move(f));
    plan.src_extent = t.copy(src).extent;
    if (src != TM_TIER_NVME) plan.src_addr = tiers_->Address(src, plan.src_extent);
  }
  t.BeginFill(dst, *extent);
  plan.dst_extent = *extent;
  if (dst != TM_TIER_NVME) plan.dst_addr = tiers_->Address(dst, *extent);

  // Execute without the lock.
  std::optional<io::CopyTicket> pending;
  mu_.Unlock();
  const Trace::Clock::time_point start = Trace::Clock::now();
  absl::Status s = mover_->Execute(plan, &pending);
  if (trace_->enabled() && plan.src >= 0) {
    static constexpr Trace::Track kTrack[TM_TIER_COUNT][TM_TIER_COUNT] = {
        {Trace::kAcquire, Trace::kDeviceToHost, Trace::kHbmToNvme},
        {Trace::kHostToDevice, Trace::kAcquire, Trace::kNvmeWrite},
        {Trace::kNvmeToHbm, Trace::kNvmeRead, Trace::kAcquire}};
    trace_->Add(kTrack[plan.src][dst], t.name, start, Trace::Clock::now(), plan.bytes);
  }
  mu_.Lock();

  // Commit: the destination becomes valid only now; a failure frees it and leaves the rest.
  if (!s.ok()) {
    FreeCopy(t, dst);
    return WithContext(s, absl::StrFormat("moving tensor \"%s\" (%s) to %s", t.name,
                                          HumanBytes(t.bytes), tm_tier_name(dst)));
  }
  t.EndFill(dst);
  if (pending.has_value()) t.Land(dst, *pending);
  return absl::OkStatus();
}

absl::Status Runtime::CheckOthersUnpinned(const Tensor& t, int keep) const {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep && t.copies[i].pins > 0) {
      return Error(
          TM_ERR_BUSY,
          absl::StrFormat("tensor \"%s\" is acquired in %s (%u outstanding acquire(s))", t.name,
                          tm_tier_name(static_cast<tm_tier>(i)), t.copies[i].pins));
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::CheckAboveUnpinned(const Tensor& t, tm_tier tier) const {
  for (int above = 0; above < tier; ++above) {
    if (t.copies[above].pins > 0) {
      return Error(TM_ERR_BUSY,
                   absl::StrFormat("cannot offload tensor \"%s\": it is acquired in %s", t.name,
                                   tm_tier_name(static_cast<tm_tier>(above))));
    }
  }
  return absl::OkStatus();
}

void Runtime::DropOthers(Tensor& t, tm_tier keep) {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep) FreeCopy(t, static_cast<tm_tier>(i));
  }
}

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

uint64_t Runtime::KeyFor(const TensorDesc& desc, uint64_t handle) {
  if (!desc.name.empty()) return absl::Hash<std::pair<int, std::string>>{}({1, desc.name});
  if (schedule_.in_step()) {
    return absl::Hash<std::tuple<int, uint64_t, uint64_t>>{}({2, created_in_step_++, desc.bytes});
  }
  return absl::Hash<std::pair<int, uint64_t>>{}({3, handle});
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
absl::Status CheckRange(const Tensor& t, uint64_t offset, uint64_t bytes, const void* buffer) {
  if (offset > t.bytes || bytes > t.bytes - offset) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("range [%llu, +%llu) is outside tensor \"%s\" of %llu bytes",
                                 static_cast<unsigned long long>(offset),
                                 static_cast<unsigned long long>(bytes), t.name,
                                 static_cast<unsigned long long>(t.bytes)));
  }
  if (buffer == nullptr && bytes > 0) return Error(TM_ERR_INVALID_ARGUMENT, "buffer is NULL");
  return absl::OkStatus();
}
}  // namespace

absl::Status Runtime::Write(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes) {
  MutexLock lock(&mu_);
  RoomScope room(*this);  // before the claim: the write may need room
  auto claimed = Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = CheckRange(t, offset, bytes, src); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  const bool whole = offset == 0 && bytes == t.bytes;

  // Land in the fastest addressable copy. A tensor only on NVMe (or never written, with an NVMe
  // home) is rewritten on NVMe, through a staging slot into a fresh extent that replaces the old
  // one only once complete: it stays on NVMe, needs no DRAM room, and a failure loses nothing.
  const bool on_nvme = !t.copy(TM_TIER_HBM).valid() && !t.copy(TM_TIER_DRAM).valid() &&
                       (t.copy(TM_TIER_NVME).valid() || t.home == TM_TIER_NVME);
  if (on_nvme) {
    room.Leave();
    auto fresh = tiers_->space(TM_TIER_NVME).Allocate(t.bytes, t.name, t.handle);
    if (!fresh.ok()) return fresh.status();
    const Extent old = t.copy(TM_TIER_NVME).valid() ? t.copy(TM_TIER_NVME).extent : Extent{};
    const uint64_t size = t.bytes;
    std::vector<io::FencePtr> uses = PendingUses(t, TM_TIER_NVME);
    absl::Status s = Unlocked(t, [&] {
      if (auto w = Retag(io::WaitAll(uses), TM_ERR_DEVICE); !w.ok()) return w;
      return mover_->WriteNvme(old, *fresh, size, offset, src, bytes);
    });
    Extent done = *fresh;
    if (!s.ok()) {
      tiers_->space(TM_TIER_NVME).Free(done);
      return WithContext(s, absl::StrFormat("writing tensor \"%s\" on NVMe", t.name));
    }
    FreeCopy(t, TM_TIER_NVME);
    t.BeginFill(TM_TIER_NVME, done);
    t.EndFill(TM_TIER_NVME);
    NoteUse(t, TM_TIER_NVME, !whole);
    return absl::OkStatus();
  }
  const tm_tier target = t.copy(TM_TIER_HBM).valid()    ? TM_TIER_HBM
                         : t.copy(TM_TIER_DRAM).valid() ? TM_TIER_DRAM
                                                        : t.home;
  if (auto s = CheckOthersUnpinned(t, target); !s.ok()) return WithContext(s, "cannot write");
  const bool fresh = whole && !t.copy(target).valid();
  absl::Status s = fresh ? Reserve(t, target)
                         : MakeValid(t, target, {}, Want{Want::kDemand, Schedule::kNever, true});
  if (!s.ok()) return s;
  room.Leave();  // the room is made: the copy itself needs no token
  char* addr = tiers_->Address(target, t.copy(target).extent) + offset;
  std::vector<io::FencePtr> uses = PendingUses(t, target);
  s = Unlocked(t, [&] { return mover_->CopyIn(target, addr, src, bytes, uses); });
  if (!s.ok()) {
    // The target may hold part of the write: it is no longer a faithful copy. Keep another.
    if (fresh || t.ResidencyMask() != TM_TIER_BIT(target)) FreeCopy(t, target);
    return s;
  }
  if (fresh) t.EndFill(target);
  DropOthers(t, target);
  NoteUse(t, target, !whole);
  return absl::OkStatus();
}

absl::Status Runtime::Read(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto claimed = Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = CheckRange(t, offset, bytes, dst); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (!t.materialized()) {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  for (tm_tier tier : {TM_TIER_HBM, TM_TIER_DRAM}) {
    if (!t.copy(tier).valid()) continue;
    const char* addr = tiers_->Address(tier, t.copy(tier).extent) + offset;
    std::vector<io::FencePtr> uses = PendingUses(t, tier);
    absl::Status s = Unlocked(t, [&] { return mover_->CopyOut(tier, addr, dst, bytes, uses); });
    if (s.ok()) NoteUse(t, tier, true);
    return s;
  }
  // Only on NVMe: through a staging slot, leaving residency as it is. For the schedule it is a
  // use in DRAM: a prefetch to DRAM ahead of it makes it a memory copy.
  const Extent e = t.copy(TM_TIER_NVME).extent;
  const uint64_t size = t.bytes;
  std::vector<io::FencePtr> uses = PendingUses(t, TM_TIER_NVME);
  absl::Status s = Unlocked(t, [&] {
    if (auto w = Retag(io::WaitAll(uses), TM_ERR_DEVICE); !w.ok()) return w;
    return mover_->ReadNvme(e, size, offset, dst, bytes);
  });
  if (!s.ok()) return WithContext(s, absl::StrFormat("reading tensor \"%s\" from NVMe", t.name));
  NoteUse(t, TM_TIER_DRAM, true);
  return s;
}

absl::Status Runtime::Reserve(Tensor& t, tm_tier tier) {
  if (t.copy(tier).valid()) return absl::OkStatus();
  BusyScope busy(t, changed_);
  auto e = Allocate(t, tier, Want{}, nullptr);
  if (!e.ok()) return e.status();
  t.BeginFill(tier, *e);
  return absl::OkStatus();
}

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
  const bool hit =
      first != nullptr && first->copy(tier).state == CopyState::kValid && !first->busy();
  std::optional<RoomScope> room;
  if (!hit) room.emplace(*this);
  auto claimed = Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  const bool writes = access != TM_ACCESS_READ;
  if (writes) {
    if (auto s = CheckOthersUnpinned(t, tier); !s.ok())
      return WithContext(s, "cannot acquire for writing");
  }
  // Only a read may leave its copy in flight on the caller's stream: a writer frees the other
  // copies next, so its data must have landed first.
  absl::Status s = access == TM_ACCESS_WRITE
                       ? Reserve(t, tier)
                       : MakeValid(t, tier, writes ? CallerStream{} : caller,
                                   Want{Want::kDemand, Schedule::kNever, true});
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
  if (writes) {
    DropOthers(t, tier);
    t.PinWrite(tier);
  }
  ++t.copy(tier).pins;
  ++counters_.acquires;
  if (hit || access == TM_ACCESS_WRITE) {
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
  if (!ValidTier(tier)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tier %d is out of range", static_cast<int>(tier)));
  }
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  Tensor& t = **found;
  TensorCopy& c = t.copy(tier);
  if (c.pins == 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("tensor \"%s\" is not acquired in %s",
                                                          t.name, tm_tier_name(tier)));
  }
  if (--c.pins == 0) {
    if (c.state == CopyState::kWriting) t.UnpinWrite(tier);
    changed_.SignalAll();  // a demand waiting for room may now evict it
  }
  return absl::OkStatus();
}

absl::Status Runtime::OffloadClaimed(Tensor& t, tm_tier tier) {
  if (!t.materialized()) return absl::OkStatus();  // zeros need no space anywhere
  if (auto s = CheckAboveUnpinned(t, tier); !s.ok()) return s;
  if (auto s = MakeValid(t, tier, {}, Want{Want::kDemand, Schedule::kNever, true}); !s.ok()) {
    return s;
  }
  for (int above = 0; above < tier; ++above) FreeCopy(t, static_cast<tm_tier>(above));
  return absl::OkStatus();
}

absl::Status Runtime::Enqueue(uint64_t handle, tm_tier tier, JobKind kind) {
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  Tensor& t = **found;
  if (kind == JobKind::kOffload) {
    // Said now rather than at sync when it is already certain.
    if (auto s = CheckAboveUnpinned(t, tier); !s.ok()) return s;
  } else if (t.copy(tier).valid() && !t.busy()) {
    return absl::OkStatus();  // already there
  } else if (int w = t.writing_tier(); w >= 0) {
    return Error(TM_ERR_BUSY, absl::StrFormat("cannot prefetch tensor \"%s\": it is acquired for "
                                              "writing in %s",
                                              t.name, tm_tier_name(static_cast<tm_tier>(w))));
  }
  ++t.queued;
  ++outstanding_;
  jobs_.push_back(Job{handle, tier, kind});
  work_.Signal();
  return absl::OkStatus();
}

absl::Status Runtime::Prefetch(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("prefetch needs tier hbm or dram, not %d",
                                                          static_cast<int>(tier)));
  }
  return Enqueue(handle, tier, JobKind::kHint);
}

absl::Status Runtime::Offload(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_DRAM && tier != TM_TIER_NVME) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("offload needs tier dram or nvme, not %d",
                                                          static_cast<int>(tier)));
  }
  return Enqueue(handle, tier, JobKind::kOffload);
}

void Runtime::CountDrop(DropReason why) {
  switch (why) {
    case DropReason::kDemand:
      ++counters_.dropped_demand;
      break;
    case DropReason::kSuperseded:
      ++counters_.dropped_superseded;
      break;
    default:
      ++counters_.dropped_no_room;
      break;
  }
}

void Runtime::MoverLoop() {
  device_->BindThread();
  MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && jobs_.empty()) work_.Wait(&mu_);
    if (stopping_) return;
    Job job = jobs_.front();
    jobs_.pop_front();
    // An offload is a request: it may need room below, so it takes the room token before
    // claiming its tensor, as a demand does. Prefetches never wait for room.
    std::optional<RoomScope> room;
    if (job.kind == JobKind::kOffload) room.emplace(*this);
    // The job stays counted in `queued` until it is done, so that Sync waits for it.
    auto claimed = Claim(job.handle);  // gone: destroyed since it was queued
    if (claimed.ok()) {
      Tensor& t = **claimed;
      absl::Status s;
      DropReason why = DropReason::kNone;
      if (job.kind != JobKind::kOffload) {
        if (t.writing_tier() >= 0) {
          // Acquired for writing since the job was queued: the writer's newer bytes supersede it.
          why = DropReason::kSuperseded;
        } else {
          const Want want = job.kind == JobKind::kPrefetch ? Want{Want::kPrefetch, job.horizon}
                                                           : Want{Want::kHint, Schedule::kNever};
          s = MakeValid(t, job.tier, {}, want, &why);
          // A prefetch is a hint: one that found no room is dropped and counted, not a failure.
          if (!s.ok() && (why != DropReason::kNone || absl::IsResourceExhausted(s))) {
            if (why == DropReason::kNone) why = DropReason::kNoRoom;
            s = absl::OkStatus();
          }
        }
        if (why != DropReason::kNone) CountDrop(why);
      } else if (CheckAboveUnpinned(t, job.tier).ok()) {
        s = OffloadClaimed(t, job.tier);
      }
      // else: acquired again since the offload was queued; the newer use supersedes it.
      --t.queued;
      if (!s.ok()) {
        Log(LogSeverity::kDebug, "async %s of \"%s\" to %s failed: %s",
            job.kind == JobKind::kOffload ? "offload" : "prefetch", t.name.c_str(),
            tm_tier_name(job.tier), std::string(s.message()).c_str());
        RecordFailure(t, s);
      }
    }
    room.reset();
    prefetch_in_flight_ -= job.prefetch_bytes;
    --outstanding_;
    // A scheduled use skipped while an offload of its tensor was queued can be prefetched now,
    // without waiting for the next use to look ahead again. (Only after an offload: after a
    // dropped prefetch it would only queue the same prefetch again.)
    if (job.kind == JobKind::kOffload) IssuePrefetches();
    changed_.SignalAll();
  }
}

absl::Status Runtime::Sync(uint64_t handle) {
  MutexLock lock(&mu_);
  for (;;) {
    auto found = Find(handle);
    if (!found.ok()) return found.status();
    if ((*found)->queued == 0 && !(*found)->busy()) break;
    changed_.Wait(&mu_);
  }
  auto claimed = Claim(handle);  // also lands a stream-ordered copy
  if (!claimed.ok()) return claimed.status();
  ReapCallerCopies(handle, true);
  for (int tier = 0; tier < TM_TIER_COUNT; ++tier) ReapDeferred(static_cast<tm_tier>(tier));
  return TakeFailures(handle);
}

absl::Status Runtime::SyncAll() {
  MutexLock lock(&mu_);
  while (outstanding_ > 0) changed_.Wait(&mu_);
  ReapCallerCopies(0, true);
  SettleDeferred();
  return TakeFailures(0);
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
  s.tensors = tensors_.size();
  s.acquires = counters_.acquires;
  s.acquire_hits = counters_.hits;
  s.acquire_misses = counters_.misses;
  s.acquire_stall_ns = counters_.stall_ns;
  s.prefetches = counters_.prefetches;
  s.evictions = counters_.evictions;
  s.eviction_bytes = counters_.eviction_bytes;
  s.schedule_length = schedule_.size();
  s.schedule_relearned = schedule_.relearned();
  s.prefetches_dropped_no_room = counters_.dropped_no_room;
  s.prefetches_dropped_demand = counters_.dropped_demand;
  s.prefetches_dropped_superseded = counters_.dropped_superseded;
  s.prefetches_dropped =
      counters_.dropped_no_room + counters_.dropped_demand + counters_.dropped_superseded;
  s.prefetches_cancelled = counters_.cancelled;
  s.moves_failed = counters_.moves_failed;
  s.demand_waits = counters_.demand_waits;
  s.demand_wait_ns = counters_.demand_wait_ns;
  s.fragmentation_evictions = counters_.fragmentation_evictions;
  return s;
}

}  // namespace tiermem
