// Callers' memory and callers' streams: tm_tensor_copy_in / copy_out (host or device memory,
// ordered on a stream), tm_tensor_release_on_stream, and what keeps tiermem's own work from
// running ahead of callers' streams (copy uses, deferred frees).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/runtime.h"
#include "lib/runtime_internal.h"
#include "lib/status.h"

namespace tiermem {
namespace {

// The C API's status for a stream that cannot be used: a bad handle, a capture, a device error.
absl::Status StreamError(const absl::Status& s, const char* function, void* stream) {
  const tm_status code = absl::IsInvalidArgument(s) ? TM_ERR_INVALID_ARGUMENT
                         : absl::IsUnimplemented(s) ? TM_ERR_UNSUPPORTED
                                                    : TM_ERR_DEVICE;
  (void)stream;  // the device's message names it
  return Error(code, absl::StrFormat("%s: %s", function, s.message()));
}

// Whether [a, a+n) and [b, b+n) share a byte (the caller's buffer and the tensor's own copy).
bool Overlap(const void* a, const void* b, uint64_t n) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + n && y < x + n;
}

absl::Status CheckCallerRange(const Tensor& t, uint64_t offset, uint64_t bytes,
                              const char* function) {
  if (offset > t.bytes || bytes > t.bytes - offset) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: range [%llu, +%llu) is outside tensor \"%s\" of %llu bytes",
                                 function, static_cast<unsigned long long>(offset),
                                 static_cast<unsigned long long>(bytes), t.name,
                                 static_cast<unsigned long long>(t.bytes)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<io::FencePtr> Runtime::StreamFence(void* stream, const char* function) {
  if (stream == nullptr) return io::FencePtr();
  auto fence = mover_->copy_engine().RecordOnStream(stream);
  if (!fence.ok()) return StreamError(fence.status(), function, stream);
  return *std::move(fence);
}

std::vector<io::FencePtr> Runtime::PendingUses(Tensor& t, tm_tier tier) {
  std::vector<io::FencePtr>& uses = t.copy(tier).uses;
  std::erase_if(uses, [](const io::FencePtr& f) { return f->Passed(); });
  return uses;
}

bool Runtime::ReapDeferred(tm_tier tier) {
  bool remain = false;
  std::erase_if(deferred_, [&](Deferred& d) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::erase_if(d.uses, [](const io::FencePtr& f) { return f->Passed(); });
    if (!d.uses.empty()) {
      remain |= d.tier == tier;
      return false;
    }
    tiers_->space(d.tier).Free(d.extent);
    return true;
  });
  if (remain) return true;
  return false;
}

void Runtime::ReapCallerCopies(uint64_t handle, bool wait) {
  if (wait) {
    // Wait for the matching copies without taking them off the list: another thread's sync
    // that looks meanwhile must find them still there and wait too (taking them off first let
    // a tm_tensor_sync return while a tm_runtime_sync elsewhere was still waiting for its copy).
    std::vector<io::FencePtr> fences;
    for (const CallerCopy& c : caller_copies_) {
      if (handle == 0 || c.handle == handle) fences.push_back(c.ticket.fence);
    }
    if (!fences.empty()) {
      mu_.Unlock();
      for (const io::FencePtr& f : fences) (void)f->Wait();
      mu_.Lock();
    }
  }
  // Every copy that is done now leaves the list, its failure recorded once.
  std::erase_if(caller_copies_, [&](CallerCopy& c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (handle != 0 && c.handle != handle) return false;
    if (!c.ticket.fence->Passed()) return false;
    if (absl::Status s = c.ticket.fence->Wait(); !s.ok()) {
      ++counters_.moves_failed;
      failures_.push_back(
          Failure{c.handle, c.tensor,
                  WithContext(Retag(s, TM_ERR_DEVICE),
                              absl::StrFormat("%s of tensor \"%s\"", c.what, c.tensor))});
    }
    return true;
  });
}

void Runtime::SettleDeferred() {
  // The memory of dropped copies goes back once what used it has passed: waited for here, so
  // that after a sync the tiers' usage (and the framework's allocator) see it free.
  std::vector<io::FencePtr> fences;
  for (const Deferred& d : deferred_) fences.insert(fences.end(), d.uses.begin(), d.uses.end());
  if (!fences.empty()) {
    mu_.Unlock();
    for (const io::FencePtr& f : fences) (void)f->Wait();
    mu_.Lock();
  }
  for (int tier = 0; tier < TM_TIER_COUNT; ++tier) ReapDeferred(static_cast<tm_tier>(tier));
}

absl::Status Runtime::ReleaseOnStream(uint64_t handle, tm_tier tier, void* stream) {
  if (stream == nullptr) return Release(handle, tier);
  if (tier < 0 || tier >= TM_TIER_COUNT) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tier %d is out of range", static_cast<int>(tier)));
  }
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
  // Whatever the stream still does with the memory, tiermem waits for before touching it.
  c.uses.push_back(*std::move(fence));
  if (--c.pins == 0) {
    if (c.state == CopyState::kWriting) t.UnpinWrite(tier);
    changed_.SignalAll();
  }
  return absl::OkStatus();
}

absl::Status Runtime::CopyIn(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes,
                             void* stream, bool stream_waits) {
  constexpr const char* kFn = "tm_tensor_copy_in";
  if (src == nullptr && bytes > 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: src is NULL", kFn));
  }
  auto fence = StreamFence(stream, kFn);  // first: the copy follows the stream's work so far
  if (!fence.ok()) return fence.status();
  const bool device_src = bytes > 0 && device_->IsDevicePointer(src);
  MutexLock lock(&mu_);
  ReapCallerCopies(0, false);
  RoomScope room(*this);  // before the claim: the copy may need room
  auto claimed = Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = CheckCallerRange(t, offset, bytes, kFn); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (int w = t.writing_tier(); w >= 0) {
    return Error(TM_ERR_BUSY,
                 absl::StrFormat("%s: tensor \"%s\" is acquired for writing in %s: write through "
                                 "the acquired pointer instead",
                                 kFn, t.name, tm_tier_name(static_cast<tm_tier>(w))));
  }
  const bool whole = offset == 0 && bytes == t.bytes;
  CallerBuffer buffer;
  buffer.addr = static_cast<char*>(const_cast<void*>(src));
  buffer.device = device_src;
  if (*fence != nullptr) buffer.after.push_back(*fence);

  // Only on NVMe (or never written, with an NVMe home): rewritten there through staging into a
  // fresh extent, as tm_tensor_write does; synchronous, so nothing is left for the stream.
  const bool above_nvme = t.copy(TM_TIER_HBM).valid() || t.copy(TM_TIER_DRAM).valid();
  const bool on_nvme = !above_nvme && (t.copy(TM_TIER_NVME).valid() || t.home == TM_TIER_NVME);
  auto write_on_nvme = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
    room.Leave();
    auto fresh = tiers_->space(TM_TIER_NVME).Allocate(t.bytes, t.name, t.handle);
    if (!fresh.ok()) return fresh.status();
    const Extent old = t.copy(TM_TIER_NVME).valid() ? t.copy(TM_TIER_NVME).extent : Extent{};
    for (io::FencePtr& f : PendingUses(t, TM_TIER_NVME)) buffer.after.push_back(std::move(f));
    const uint64_t size = t.bytes;
    absl::Status s = Unlocked(
        t, [&] { return mover_->WriteNvmeFrom(old, *fresh, size, offset, buffer, bytes); });
    Extent done = *fresh;
    if (!s.ok()) {
      tiers_->space(TM_TIER_NVME).Free(done);
      return WithContext(s, absl::StrFormat("%s: writing tensor \"%s\" on NVMe", kFn, t.name));
    }
    FreeCopy(t, TM_TIER_NVME);
    t.BeginFill(TM_TIER_NVME, done);
    t.EndFill(TM_TIER_NVME);
    NoteUse(t, TM_TIER_NVME, !whole);
    return absl::OkStatus();
  };
  if (on_nvme) return write_on_nvme();

  // Into the fastest valid copy, else the home tier: device memory goes straight to DRAM
  // (D2H) for a DRAM copy, never through tiermem's HBM.
  const tm_tier target = t.copy(TM_TIER_HBM).valid()    ? TM_TIER_HBM
                         : t.copy(TM_TIER_DRAM).valid() ? TM_TIER_DRAM
                                                        : t.home;
  if (auto s = CheckOthersUnpinned(t, target); !s.ok()) return WithContext(s, kFn);
  const bool fresh = whole && !t.copy(target).valid();
  absl::Status s = fresh ? Reserve(t, target)
                         : MakeValid(t, target, {}, Want{Want::kDemand, Schedule::kNever, true});
  if (!s.ok() && target == TM_TIER_DRAM && !above_nvme && ToTmStatus(s) == TM_ERR_OUT_OF_MEMORY) {
    // Nothing above NVMe holds the tensor and DRAM cannot take it (a tensor larger than the
    // whole DRAM tier, or one whose room is pinned): it goes on NVMe, through staging, rather
    // than failing while the NVMe tier has room.
    return write_on_nvme();
  }
  if (!s.ok()) return WithContext(s, kFn);
  room.Leave();
  char* addr = tiers_->Address(target, t.copy(target).extent) + offset;
  if (Overlap(addr, src, bytes)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: src overlaps the bytes it is copied to (tensor \"%s\"'s own "
                                 "copy in %s)",
                                 kFn, t.name, tm_tier_name(target)));
  }
  for (io::FencePtr& f : PendingUses(t, target)) buffer.after.push_back(std::move(f));
  const io::CopyDirection dir = Mover::Direction(target, device_src, true);
  if (dir == io::CopyDirection::kHostToHost && buffer.after.empty()) {
    // Host memory into the DRAM copy with nothing to wait for: a memcpy here is the copy, done
    // by the time the call returns (an engine would only add a hop and a thread).
    Unlocked(t, [&] {
      std::memcpy(addr, src, bytes);
      return absl::OkStatus();
    }).IgnoreError();
    if (fresh) t.EndFill(target);
    DropOthers(t, target);
    NoteUse(t, target, !whole);
    return absl::OkStatus();
  }
  absl::StatusOr<io::CopyTicket> ticket;
  s = Unlocked(t, [&] {
    ticket = mover_->copy_engine().Enqueue(dir, addr, src, bytes, buffer.after);
    return ticket.status();
  });
  if (!s.ok()) {  // nothing of it runs: the tensor is as it was
    if (fresh) FreeCopy(t, target);
    return WithContext(Retag(s, TM_ERR_DEVICE), absl::StrFormat("%s: tensor \"%s\" in %s", kFn,
                                                                t.name, tm_tier_name(target)));
  }
  if (fresh) t.EndFill(target);
  // Valid in the stream's order now; replaces the other copies once it has landed.
  t.Land(target, *ticket, /*replaces=*/true);
  if (stream != nullptr && stream_waits) {
    if (s = mover_->copy_engine().StreamWait(stream, ticket->fence); !s.ok()) {
      return StreamError(s, kFn, stream);
    }
  }
  NoteUse(t, target, !whole);
  return absl::OkStatus();
}

absl::Status Runtime::CopyOut(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes,
                              void* stream) {
  constexpr const char* kFn = "tm_tensor_copy_out";
  if (dst == nullptr && bytes > 0) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: dst is NULL", kFn));
  }
  auto fence = StreamFence(stream, kFn);
  if (!fence.ok()) return fence.status();
  const bool device_dst = bytes > 0 && device_->IsDevicePointer(dst);
  MutexLock lock(&mu_);
  ReapCallerCopies(0, false);
  // A copy still landing (a copy_in, a stream-ordered acquire) is not waited for on the host:
  // this copy is ordered after it on the device, which keeps program order per tensor.
  auto claimed = Claim(handle, /*land=*/false);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = CheckCallerRange(t, offset, bytes, kFn); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (int w = t.writing_tier(); w >= 0) {
    return Error(TM_ERR_BUSY,
                 absl::StrFormat("%s: tensor \"%s\" is acquired for writing in %s: its bytes "
                                 "are in flux until released",
                                 kFn, t.name, tm_tier_name(static_cast<tm_tier>(w))));
  }
  CallerBuffer buffer;
  buffer.addr = static_cast<char*>(dst);
  buffer.device = device_dst;
  if (*fence != nullptr) buffer.after.push_back(*fence);

  if (!t.materialized()) {
    // Never written: zeros, once the stream's work so far is done (a host wait: a corner case).
    absl::Status s = Unlocked(t, [&] {
      if (auto w = Retag(io::WaitAll(buffer.after), TM_ERR_DEVICE); !w.ok()) return w;
      if (!device_dst) {
        std::memset(dst, 0, bytes);
        return absl::OkStatus();
      }
      return Retag(device_->Fill(dst, 0, bytes), TM_ERR_DEVICE);
    });
    if (s.ok()) NoteUse(t, TM_TIER_DRAM, true);
    return s;
  }
  // A landing copy that replaces the others is the only current one.
  const tm_tier source = t.landing.has_value() && t.landing_replaces ? t.landing_tier
                         : t.copy(TM_TIER_HBM).valid()               ? TM_TIER_HBM
                         : t.copy(TM_TIER_DRAM).valid()              ? TM_TIER_DRAM
                                                                     : TM_TIER_NVME;
  for (io::FencePtr& f : PendingUses(t, source)) buffer.after.push_back(std::move(f));
  if (t.landing.has_value() && t.landing_tier == source) buffer.after.push_back(t.landing->fence);
  if (source == TM_TIER_NVME) {
    // NVMe -> staging -> dst, pipelined; done when it returns. For the schedule, a use in DRAM:
    // a prefetch to DRAM ahead of it leaves only the last copy.
    const Extent e = t.copy(TM_TIER_NVME).extent;
    const uint64_t size = t.bytes;
    absl::Status s =
        Unlocked(t, [&] { return mover_->ReadNvmeTo(e, size, offset, buffer, bytes); });
    if (!s.ok()) {
      return WithContext(s, absl::StrFormat("%s: reading tensor \"%s\" from NVMe", kFn, t.name));
    }
    NoteUse(t, TM_TIER_DRAM, true);
    return absl::OkStatus();
  }
  const char* addr = tiers_->Address(source, t.copy(source).extent) + offset;
  if (Overlap(addr, dst, bytes)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: dst overlaps the bytes it is copied from (tensor \"%s\"'s "
                                 "own copy in %s)",
                                 kFn, t.name, tm_tier_name(source)));
  }
  const io::CopyDirection dir = Mover::Direction(source, device_dst, false);
  if (dir == io::CopyDirection::kHostToHost && buffer.after.empty()) {
    Unlocked(t, [&] {
      std::memcpy(dst, addr, bytes);
      return absl::OkStatus();
    }).IgnoreError();
    NoteUse(t, source, true);
    return absl::OkStatus();
  }
  absl::StatusOr<io::CopyTicket> ticket;
  absl::Status s = Unlocked(t, [&] {
    ticket = mover_->copy_engine().Enqueue(dir, dst, addr, bytes, buffer.after);
    return ticket.status();
  });
  if (!s.ok()) {
    return WithContext(Retag(s, TM_ERR_DEVICE), absl::StrFormat("%s: tensor \"%s\" from %s", kFn,
                                                                t.name, tm_tier_name(source)));
  }
  // The source is not evicted, refilled or freed before the copy has read it.
  t.copy(source).uses.push_back(ticket->fence);
  caller_copies_.push_back(CallerCopy{t.handle, t.name, "copy_out", *ticket});
  if (stream != nullptr) {
    if (s = mover_->copy_engine().StreamWait(stream, ticket->fence); !s.ok()) {
      return StreamError(s, kFn, stream);
    }
  }
  NoteUse(t, source, true);
  return absl::OkStatus();
}

}  // namespace tiermem
