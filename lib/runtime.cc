// The tensor operations of the C API, the move protocol (claim, move without the lock, commit),
// the asynchronous job queue and sync.
#include "lib/runtime.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/log.h"
#include "lib/status.h"

namespace tiermem {
namespace {

using io::Log;
using io::LogSeverity;

bool ValidTier(int tier) { return tier >= 0 && tier < TM_TIER_COUNT; }

}  // namespace

absl::StatusOr<Tensor*> Runtime::Find(uint64_t handle) {
  Tensor* t = tensors_.Find(handle);
  if (t == nullptr) {
    return Error(TM_ERR_INVALID_HANDLE,
                 absl::StrFormat("tensor handle 0x%016x is zero, destroyed or of another runtime",
                                 handle));
  }
  return t;
}

template <typename F>
absl::Status Runtime::Unlocked(Tensor& t, F&& f) {
  t.busy = true;
  mu_.Unlock();
  absl::Status s = f();
  mu_.Lock();
  t.busy = false;
  changed_.SignalAll();
  return s;
}

absl::StatusOr<Tensor*> Runtime::Claim(uint64_t handle) {
  for (;;) {
    auto t = Find(handle);  // again after every wait: it may have been destroyed meanwhile
    if (!t.ok()) return t.status();
    Tensor& tensor = **t;
    if (tensor.busy) {
      changed_.Wait(&mu_);
      continue;
    }
    if (tensor.pending.has_value()) {
      io::CopyTicket ticket = *tensor.pending;
      tensor.pending.reset();
      absl::Status s =
          Unlocked(tensor, [&] { return Retag(mover_->copy_engine().Wait(ticket), TM_ERR_DEVICE); });
      if (!s.ok()) {
        // The stream-ordered copy failed: that HBM copy never became what it claimed.
        mover_->Drop(tensor, TM_TIER_HBM);
        if (tensor.error.ok()) tensor.error = s;
      }
      continue;
    }
    return &tensor;
  }
}

absl::Status Runtime::MakeValid(Tensor& t, tm_tier dst, void* stream, uint64_t horizon) {
  if (t.copy(dst).valid) return absl::OkStatus();
  if (int w = t.writing_tier(); w >= 0) {
    // Copying bytes that a writer is changing would make a torn copy look valid.
    return Error(TM_ERR_BUSY, absl::StrFormat("tensor \"%s\" is acquired for writing in %s",
                                              t.name, tm_tier_name(static_cast<tm_tier>(w))));
  }
  t.busy = true;  // for the whole move: eviction below may release the lock too
  auto finish = [&](absl::Status s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    t.busy = false;
    changed_.SignalAll();
    return s;
  };
  auto extent = Allocate(t, dst, horizon);
  if (!extent.ok()) return finish(extent.status());
  MovePlan plan = mover_->Prepare(t, dst, *extent);
  plan.stream = stream;
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
  mover_->Commit(t, plan, s);
  if (s.ok() && pending.has_value()) t.pending = pending;
  if (!s.ok()) {
    s = WithContext(s, absl::StrFormat("moving tensor \"%s\" (%s) to %s", t.name,
                                       HumanBytes(t.bytes), tm_tier_name(dst)));
  }
  return finish(s);
}

absl::Status Runtime::CheckOthersUnpinned(const Tensor& t, int keep) const {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep && t.copies[i].pins > 0) {
      return Error(TM_ERR_BUSY,
                   absl::StrFormat("tensor \"%s\" is acquired in %s (%u outstanding acquire(s))",
                                   t.name, tm_tier_name(static_cast<tm_tier>(i)), t.copies[i].pins));
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::CheckAboveUnpinned(const Tensor& t, tm_tier tier) const {
  for (int above = 0; above < tier; ++above) {
    if (t.copies[above].pins > 0) {
      return Error(TM_ERR_BUSY, absl::StrFormat("cannot offload tensor \"%s\": it is acquired in %s",
                                                t.name, tm_tier_name(static_cast<tm_tier>(above))));
    }
  }
  return absl::OkStatus();
}

void Runtime::DropOthers(Tensor& t, tm_tier keep) {
  for (int i = 0; i < TM_TIER_COUNT; ++i) {
    if (i != keep) mover_->Drop(t, static_cast<tm_tier>(i));
  }
}

absl::StatusOr<uint64_t> Runtime::CreateTensor(const TensorDesc& desc) {
  if (desc.bytes == 0) return Error(TM_ERR_INVALID_ARGUMENT, "a tensor needs at least 1 byte");
  // A tensor larger than every tier could never hold a copy anywhere; near 2^64 its size would
  // also wrap the round-ups of the allocator and the movers (it once aliased another tensor).
  uint64_t largest = 0;
  for (int tier = 0; tier < TM_TIER_COUNT; ++tier) {
    largest = std::max(largest, mover_->space(static_cast<tm_tier>(tier)).Stats().capacity);
  }
  if (desc.bytes > largest) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tensor \"%s\" of %llu bytes is larger than every tier (the "
                                 "largest holds %llu bytes): it could never be placed",
                                 desc.name, static_cast<unsigned long long>(desc.bytes),
                                 static_cast<unsigned long long>(largest)));
  }
  if (desc.cls < 0 || desc.cls >= TM_CLASS_COUNT) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("tensor class %d is out of range", desc.cls));
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
  raw->name = desc.name.empty() ? absl::StrFormat("tensor-%08x", static_cast<uint32_t>(handle >> 32))
                                : desc.name;
  return handle;
}

absl::Status Runtime::DestroyTensor(uint64_t handle) {
  MutexLock lock(&mu_);
  auto t = Claim(handle);
  if (!t.ok()) return t.status();
  if (auto s = CheckOthersUnpinned(**t, -1); !s.ok()) return WithContext(s, "cannot destroy");
  for (int i = 0; i < TM_TIER_COUNT; ++i) mover_->Drop(**t, static_cast<tm_tier>(i));
  tensors_.Remove(handle);  // its queued moves find no tensor and are dropped
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
  auto claimed = Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = CheckRange(t, offset, bytes, src); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();

  // Land in the fastest addressable copy. A tensor only on NVMe (or never written, with an NVMe
  // home) is rewritten on NVMe, through a staging slot into a fresh extent that replaces the old
  // one only once complete: it stays on NVMe, needs no DRAM room, and a failure loses nothing.
  const bool on_nvme = !t.copy(TM_TIER_HBM).valid && !t.copy(TM_TIER_DRAM).valid &&
                       (t.copy(TM_TIER_NVME).valid || t.home == TM_TIER_NVME);
  if (on_nvme) {
    auto fresh = mover_->space(TM_TIER_NVME).Allocate(t.bytes, t.name);
    if (!fresh.ok()) return fresh.status();
    const Extent old = t.copy(TM_TIER_NVME).valid ? t.copy(TM_TIER_NVME).extent : Extent{};
    const uint64_t size = t.bytes;
    absl::Status s =
        Unlocked(t, [&] { return mover_->WriteNvme(old, *fresh, size, offset, src, bytes); });
    Extent done = *fresh;
    if (!s.ok()) {
      mover_->space(TM_TIER_NVME).Free(done);
      return WithContext(s, absl::StrFormat("writing tensor \"%s\" on NVMe", t.name));
    }
    mover_->Drop(t, TM_TIER_NVME);
    t.copy(TM_TIER_NVME).extent = done;
    t.copy(TM_TIER_NVME).valid = true;
    return absl::OkStatus();
  }
  const tm_tier target = t.copy(TM_TIER_HBM).valid    ? TM_TIER_HBM
                         : t.copy(TM_TIER_DRAM).valid ? TM_TIER_DRAM
                                                      : t.home;
  if (auto s = CheckOthersUnpinned(t, target); !s.ok()) return WithContext(s, "cannot write");
  const bool whole = offset == 0 && bytes == t.bytes;
  absl::Status s = whole && !t.copy(target).valid ? Reserve(t, target) : MakeValid(t, target);
  if (!s.ok()) return s;
  char* addr = mover_->Address(t, target) + offset;
  s = Unlocked(t, [&] { return mover_->CopyIn(target, addr, src, bytes); });
  if (!s.ok()) {
    // The target may hold part of the write: it is no longer a faithful copy. Keep another.
    if (t.ResidencyMask() != TM_TIER_BIT(target)) mover_->Drop(t, target);
    return s;
  }
  DropOthers(t, target);
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
    if (!t.copy(tier).valid) continue;
    const char* addr = mover_->Address(t, tier) + offset;
    return Unlocked(t, [&] { return mover_->CopyOut(tier, addr, dst, bytes); });
  }
  // Only on NVMe: through a staging slot, leaving residency as it is.
  const Extent e = t.copy(TM_TIER_NVME).extent;
  const uint64_t size = t.bytes;
  return Unlocked(t, [&] { return mover_->ReadNvme(e, size, offset, dst, bytes); });
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
  const Trace::Clock::time_point start = Trace::Clock::now();
  MutexLock lock(&mu_);
  // A hit: the copy is in place and nothing of the tensor is moving.
  bool hit = false;
  if (Tensor* first = tensors_.Find(handle); first != nullptr) {
    hit = first->copy(tier).valid && !first->busy && !first->pending.has_value();
  }
  auto claimed = Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  const bool writes = access != TM_ACCESS_READ;
  if (writes) {
    if (auto s = CheckOthersUnpinned(t, tier); !s.ok()) return WithContext(s, "cannot acquire for writing");
  }
  // Only a read may leave its copy in flight on the caller's stream: a writer frees the other
  // copies next, so its data must have landed first.
  absl::Status s = access == TM_ACCESS_WRITE ? Reserve(t, tier)
                                             : MakeValid(t, tier, writes ? nullptr : stream);
  if (!s.ok()) return s;
  if (writes) {
    DropOthers(t, tier);
    t.copy(tier).writing = true;
  }
  ++t.copy(tier).pins;
  t.last_use = ++tick_;
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
  schedule_.OnAcquire(handle, tier, access != TM_ACCESS_WRITE);
  void* address = mover_->Address(t, tier);
  IssuePrefetches();
  return address;
}

absl::Status Runtime::Release(uint64_t handle, tm_tier tier) {
  if (!ValidTier(tier)) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("tier %d is out of range", static_cast<int>(tier)));
  }
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  TensorCopy& c = (*found)->copy(tier);
  if (c.pins == 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("tensor \"%s\" is not acquired in %s",
                                                          (*found)->name, tm_tier_name(tier)));
  }
  if (--c.pins == 0) c.writing = false;
  return absl::OkStatus();
}

absl::Status Runtime::OffloadClaimed(Tensor& t, tm_tier tier) {
  if (!t.materialized()) return absl::OkStatus();  // zeros need no space anywhere
  if (auto s = CheckAboveUnpinned(t, tier); !s.ok()) return s;
  if (auto s = MakeValid(t, tier); !s.ok()) return s;
  for (int above = 0; above < tier; ++above) mover_->Drop(t, static_cast<tm_tier>(above));
  return absl::OkStatus();
}

absl::Status Runtime::Enqueue(uint64_t handle, tm_tier tier, bool offload) {
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  Tensor& t = **found;
  if (offload) {
    // Said now rather than at sync when it is already certain.
    if (auto s = CheckAboveUnpinned(t, tier); !s.ok()) return s;
  } else if (t.copy(tier).valid && !t.busy) {
    return absl::OkStatus();  // already there
  } else if (int w = t.writing_tier(); w >= 0) {
    return Error(TM_ERR_BUSY, absl::StrFormat("cannot prefetch tensor \"%s\": it is acquired for "
                                              "writing in %s",
                                              t.name, tm_tier_name(static_cast<tm_tier>(w))));
  }
  ++t.queued;
  ++outstanding_;
  jobs_.push_back(Job{handle, tier, offload});
  work_.Signal();
  return absl::OkStatus();
}

absl::Status Runtime::Prefetch(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("prefetch needs tier hbm or dram, not %d", static_cast<int>(tier)));
  }
  return Enqueue(handle, tier, false);
}

absl::Status Runtime::Offload(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_DRAM && tier != TM_TIER_NVME) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("offload needs tier dram or nvme, not %d", static_cast<int>(tier)));
  }
  return Enqueue(handle, tier, true);
}

void Runtime::MoverLoop() {
  MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && jobs_.empty()) work_.Wait(&mu_);
    if (stopping_) return;
    Job job = jobs_.front();
    jobs_.pop_front();
    // The job stays counted in `queued` until it is done, so that Sync waits for it.
    auto claimed = Claim(job.handle);  // gone: destroyed since it was queued
    if (claimed.ok()) {
      Tensor& t = **claimed;
      absl::Status s;
      if (t.writing_tier() >= 0) {
        // Acquired for writing since the job was queued: the writer's newer bytes supersede it.
      } else if (!job.offload) {
        s = MakeValid(t, job.tier, nullptr, job.horizon);
      } else if (CheckAboveUnpinned(t, job.tier).ok()) {
        s = OffloadClaimed(t, job.tier);
      }
      // else: acquired again since the offload was queued; the newer use supersedes it.
      --t.queued;
      // A scheduled prefetch that found no room is a missed chance, not an error of the tensor.
      if (job.horizon != kDemand && absl::IsResourceExhausted(s)) s = absl::OkStatus();
      if (!s.ok()) {
        Log(LogSeverity::kDebug, "async %s of \"%s\" to %s failed: %s",
            job.offload ? "offload" : "prefetch", t.name.c_str(), tm_tier_name(job.tier),
            std::string(s.message()).c_str());
        if (t.error.ok()) t.error = s;
      }
    }
    prefetch_in_flight_ -= job.prefetch_bytes;
    --outstanding_;
    changed_.SignalAll();
  }
}

absl::Status Runtime::Sync(uint64_t handle) {
  MutexLock lock(&mu_);
  for (;;) {
    auto found = Find(handle);
    if (!found.ok()) return found.status();
    if ((*found)->queued == 0 && !(*found)->busy) break;
    changed_.Wait(&mu_);
  }
  auto claimed = Claim(handle);  // also lands a stream-ordered copy
  if (!claimed.ok()) return claimed.status();
  absl::Status s = std::move((*claimed)->error);
  (*claimed)->error = absl::OkStatus();
  return s;
}

absl::Status Runtime::SyncAll() {
  MutexLock lock(&mu_);
  while (outstanding_ > 0) changed_.Wait(&mu_);
  absl::Status first;
  int failed = 0;
  tensors_.ForEach([&](Tensor& t) {
    if (t.error.ok()) return;
    if (failed++ == 0) first = t.error;
    t.error = absl::OkStatus();
  });
  if (failed > 1) {
    return WithContext(first, absl::StrFormat("%d asynchronous moves failed; the first", failed));
  }
  return first;
}

absl::StatusOr<uint32_t> Runtime::Residency(uint64_t handle) {
  MutexLock lock(&mu_);
  auto found = Find(handle);
  if (!found.ok()) return found.status();
  return (*found)->ResidencyMask();
}

tm_stats Runtime::Stats() {
  tm_stats s = TM_STATS_INIT;
  s.tiers[TM_TIER_HBM] = hbm_->space().Stats();
  s.tiers[TM_TIER_DRAM] = dram_->space().Stats();
  s.tiers[TM_TIER_NVME] = nvme_->space().Stats();
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
  return s;
}

}  // namespace tiermem
