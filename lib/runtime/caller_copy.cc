// Callers' memory and callers' streams: tm_tensor_copy_in / copy_out (host or device memory,
// ordered on a stream) and tm_tensor_write / read (host memory, the host waits) are one path:
// into the fastest valid copy (or on NVMe through staging), out of the fastest valid copy.
// What keeps tiermem's own work from running ahead of callers' streams lives here too.
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

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

// Checks shared by both directions on a claimed tensor: the range, and, for a copy the host
// does not wait for, no writer acquired (its bytes change in an order the copy cannot know; a
// host-synchronous read or write is ordered by the caller's own thread, as it always was).
absl::Status CheckCallerCopy(const Tensor& t, uint64_t offset, uint64_t bytes, const char* fn,
                             bool into, bool wait) {
  if (auto s = CheckCallerRange(t, offset, bytes, fn); !s.ok()) return s;
  if (int w = t.writing_tier(); w >= 0 && bytes > 0 && !wait) {
    return Error(TM_ERR_BUSY, absl::StrFormat("%s: tensor \"%s\" is acquired for writing in %s: %s",
                                              fn, t.name, tm_tier_name(static_cast<tm_tier>(w)),
                                              into ? "write through the acquired pointer instead"
                                                   : "its bytes are in flux until released"));
  }
  return absl::OkStatus();
}

// A caller copy's NVMe legs on the trace's NVMe tracks, as moved() counted them: the staging
// slot is DRAM, so they are the "nvme read" and "nvme write" of a move through DRAM. Both span
// the whole copy (its reads and writes interleave chunk by chunk).
void TraceCallerNvme(Trace& trace, const std::string& name, const NvmeTally& tally,
                     Trace::Clock::time_point start) {
  if (!trace.enabled()) return;
  const Trace::Clock::time_point end = Trace::Clock::now();
  if (tally.read > 0) trace.Add(Trace::kNvmeRead, name, start, end, tally.read);
  if (tally.written > 0) trace.Add(Trace::kNvmeWrite, name, start, end, tally.written);
}

}  // namespace

// One copy between a caller's buffer and a tensor, as each entry point asks for it.
struct CallerCopies::CallerCopyRequest {
  const char* fn = "";  // the C function, for messages
  uint64_t handle = 0, offset = 0, bytes = 0;
  char* buffer = nullptr;    // the caller's memory
  bool device = false;       // ... is device memory (crosses the link)
  io::FencePtr fence;        // the caller's stream's work so far; none without a stream
  void* stream = nullptr;    // waits for the copy; none: the caller syncs (or `wait`)
  bool wait = false;         // the host waits for the copy (tm_tensor_write / read)
  bool stream_waits = true;  // false: tm_tensor_copy_in_async (the stream's later work does not)
};

absl::StatusOr<io::FencePtr> CallerCopies::StreamFence(void* stream, const char* function) {
  if (stream == nullptr) return io::FencePtr();
  auto fence = core_.mover()->copy_engine().RecordOnStream(stream);
  if (!fence.ok()) return StreamError(fence.status(), function, stream);
  return *std::move(fence);
}

absl::Status Runtime::CopyIn(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes,
                             void* stream, bool stream_waits) {
  return copies_.CallerCopy(stream_waits ? "tm_tensor_copy_in" : "tm_tensor_copy_in_async", handle,
                            offset, const_cast<void*>(src), bytes, stream, /*into=*/true,
                            /*wait=*/false, stream_waits);
}

absl::Status Runtime::Write(uint64_t handle, uint64_t offset, const void* src, uint64_t bytes) {
  return copies_.CallerCopy("tm_tensor_write", handle, offset, const_cast<void*>(src), bytes,
                            nullptr,
                            /*into=*/true, /*wait=*/true);
}

absl::Status Runtime::CopyOut(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes,
                              void* stream) {
  return copies_.CallerCopy("tm_tensor_copy_out", handle, offset, dst, bytes, stream,
                            /*into=*/false,
                            /*wait=*/false);
}

absl::Status Runtime::Read(uint64_t handle, uint64_t offset, void* dst, uint64_t bytes) {
  return copies_.CallerCopy("tm_tensor_read", handle, offset, dst, bytes, nullptr, /*into=*/false,
                            /*wait=*/true);
}

absl::Status CallerCopies::CallerCopy(const char* fn, uint64_t handle, uint64_t offset,
                                      void* buffer, uint64_t bytes, void* stream, bool into,
                                      bool wait, bool stream_waits) {
  if (buffer == nullptr && bytes > 0) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: %s is NULL", fn, into ? "src" : "dst"));
  }
  CallerCopyRequest r;
  r.fn = fn;
  r.handle = handle;
  r.offset = offset;
  r.bytes = bytes;
  r.buffer = static_cast<char*>(buffer);
  r.stream = stream;
  r.wait = wait;
  r.stream_waits = stream_waits;
  auto fence = StreamFence(stream, fn);  // first: the copy follows the stream's work so far
  if (!fence.ok()) return fence.status();
  r.fence = *std::move(fence);
  r.device = bytes > 0 && core_.device()->IsDevicePointer(buffer);
  CoreLock lock(core_);
  ReapCallerCopies(0, false);
  absl::Status s = into ? CopyInto(r) : CopyFrom(r);
  if (s.ok()) (into ? counters_.copied_in_bytes : counters_.copied_out_bytes) += bytes;
  return s;
}

absl::Status CallerCopies::CopyInto(const CallerCopyRequest& r) {
  RoomScope room(core_, r.handle);  // before the claim: the copy may need room
  auto claimed = core_.Claim(r.handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = core_.CheckNotHeld(t, "write it"); !s.ok()) return s;
  if (auto s = CheckCallerCopy(t, r.offset, r.bytes, r.fn, true, r.wait); !s.ok() || r.bytes == 0) {
    return s;
  }
  const bool whole = r.offset == 0 && r.bytes == t.bytes;
  // Dropped for recompute: a partial write needs the rest of the bytes (a whole one replaces them).
  if (t.dropped && !whole) {
    if (auto s = moves_.MakeValid(t, recompute_.RebuildTier(t), {}, Demand()); !s.ok())
      return WithContext(s, r.fn);
  }
  CallerBuffer buffer{r.buffer, r.device, {}};
  if (r.fence != nullptr) buffer.after.push_back(r.fence);
  // Only on NVMe (or never written, with an NVMe home): rewritten there through staging into a
  // fresh extent; synchronous, so nothing is left for the stream.
  const bool above_nvme = t.copy(TM_TIER_HBM).valid() || t.copy(TM_TIER_DRAM).valid();
  if (!above_nvme && (t.copy(TM_TIER_NVME).valid() || t.home == TM_TIER_NVME)) {
    room.Leave();
    return RewriteOnNvme(t, r, buffer);
  }
  // Into the fastest valid copy, else the home tier: device memory goes straight to DRAM
  // (D2H) for a DRAM copy, never through tiermem's HBM.
  const tm_tier target = t.copy(TM_TIER_HBM).valid()    ? TM_TIER_HBM
                         : t.copy(TM_TIER_DRAM).valid() ? TM_TIER_DRAM
                                                        : t.home;
  if (auto s = core_.CheckOthersUnpinned(t, target); !s.ok()) return WithContext(s, r.fn);
  const bool fresh = whole && !t.copy(target).valid();
  absl::Status s = fresh ? moves_.Reserve(t, target) : moves_.MakeValid(t, target, {}, Demand());
  if (!s.ok() && target == TM_TIER_DRAM && !above_nvme && ToTmStatus(s) == TM_ERR_OUT_OF_MEMORY) {
    // Nothing above NVMe holds the tensor and DRAM cannot take it (a tensor larger than the
    // whole DRAM tier, or one whose room is pinned): it goes on NVMe, through staging, rather
    // than failing while the NVMe tier has room.
    room.Leave();
    return RewriteOnNvme(t, r, buffer);
  }
  if (!s.ok()) return WithContext(s, r.fn);
  room.Leave();
  char* addr = core_.tiers()->Address(target, t.copy(target).extent) + r.offset;
  for (io::FencePtr& f : core_.PendingUses(t, target)) buffer.after.push_back(std::move(f));
  auto copy = CopyTierAndCaller(t, target, addr, r, buffer, /*into_tier=*/true);
  if (!copy.ok()) {
    // The target may hold part of the bytes: it is no longer a faithful copy. Keep another.
    if (fresh || t.ResidencyMask() != TM_TIER_BIT(target)) core_.FreeCopy(t, target);
    return copy.status();
  }
  if (fresh) t.EndFill(target);
  if (!copy->has_value()) {  // done: the other copies are stale now
    core_.DropOthers(t, target);
  } else {
    // Valid in the stream's order now; replaces the other copies once it has landed.
    t.Land(target, **copy, /*replaces=*/true);
    if (r.stream != nullptr && r.stream_waits) {
      if (s = core_.mover()->copy_engine().StreamWait(r.stream, (*copy)->fence); !s.ok()) {
        return StreamError(s, r.fn, r.stream);
      }
    }
  }
  prefetcher_.NoteUse(t, target, !whole);
  return absl::OkStatus();
}

absl::Status CallerCopies::RewriteOnNvme(Tensor& t, const CallerCopyRequest& r,
                                         CallerBuffer& buffer) {
  auto fresh = core_.tiers()->space(TM_TIER_NVME).Allocate(t.bytes, t.name, t.handle);
  if (!fresh.ok()) return fresh.status();
  const Extent old = t.copy(TM_TIER_NVME).valid() ? t.copy(TM_TIER_NVME).extent : Extent{};
  for (io::FencePtr& f : core_.PendingUses(t, TM_TIER_NVME)) buffer.after.push_back(std::move(f));
  const uint64_t size = t.bytes;
  NvmeTally tally;
  const Trace::Clock::time_point start = Trace::Clock::now();
  absl::Status s = core_.Unlocked(t, [&] {
    return core_.mover()->WriteNvmeFrom(old, *fresh, size, r.offset, buffer, r.bytes, &tally);
  });
  TraceCallerNvme(*core_.trace(), t.name, tally, start);
  if (!s.ok()) {
    Extent done = *fresh;
    core_.tiers()->space(TM_TIER_NVME).Free(done);
    return WithContext(s, absl::StrFormat("%s: writing tensor \"%s\" on NVMe", r.fn, t.name));
  }
  core_.FreeCopy(t, TM_TIER_NVME);
  t.BeginFill(TM_TIER_NVME, *fresh);
  t.EndFill(TM_TIER_NVME);
  core_.DropOthers(t, TM_TIER_NVME);
  prefetcher_.NoteUse(t, TM_TIER_NVME, !(r.offset == 0 && r.bytes == t.bytes));
  return absl::OkStatus();
}

// tm_tensor_copy_done: whether a tensor's copies to and from callers' memory have landed, asked
// without blocking, so that a caller whose stream does not wait for a copy
// (tm_tensor_copy_in_async) learns when its source may be reused.
absl::StatusOr<bool> Runtime::CopyDone(uint64_t handle) {
  CoreLock lock(core_);
  // Find, not Claim: another thread's operation on the tensor is not waited for.
  auto found = core_.Find(handle);
  if (!found.ok()) return found.status();
  const Tensor& t = **found;
  // A copy_in (or a stream-ordered acquire) lands as the tensor's landing copy; copy_outs are
  // listed until reaped.
  if (t.landing.has_value() && !t.landing_own && !t.landing->fence->Passed()) return false;
  return copies_.Passed(handle);
}

bool CallerCopies::Passed(uint64_t handle) const {
  return std::none_of(in_flight_.begin(), in_flight_.end(), [&](const CopyInFlight& c) {
    return c.handle == handle && !c.ticket.fence->Passed();
  });
}

void CallerCopies::WaitAll() {
  for (const CopyInFlight& c : in_flight_) (void)c.ticket.fence->Wait();
}

absl::Status CallerCopies::CopyFrom(const CallerCopyRequest& r) {
  // A copy still landing (a copy_in, a stream-ordered acquire) is not waited for on the host:
  // this copy is ordered after it on the device, which keeps program order per tensor. A read
  // that the host waits for lands it first (a failed landing copy is then not read).
  // A tensor dropped for recompute is rebuilt first, which takes room: the room token, then the
  // claim again.
  std::optional<RoomScope> room;
  auto claimed = core_.Claim(r.handle, /*land=*/r.wait);
  while (claimed.ok() && (*claimed)->dropped && !room.has_value()) {
    room.emplace(core_, r.handle);
    claimed = core_.Claim(r.handle, /*land=*/r.wait);
  }
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (auto s = CheckCallerCopy(t, r.offset, r.bytes, r.fn, false, r.wait);
      !s.ok() || r.bytes == 0) {
    return s;
  }
  if (t.dropped) {
    if (auto s = moves_.MakeValid(t, recompute_.RebuildTier(t), {}, Demand()); !s.ok())
      return WithContext(s, r.fn);
  }
  room.reset();
  CallerBuffer buffer{r.buffer, r.device, {}};
  if (r.fence != nullptr) buffer.after.push_back(r.fence);
  if (!t.materialized()) return ReadZeros(t, r, buffer);
  // A landing copy that replaces the others is the only current one.
  const tm_tier source = t.landing.has_value() && t.landing_replaces ? t.landing_tier
                         : t.copy(TM_TIER_HBM).valid()               ? TM_TIER_HBM
                         : t.copy(TM_TIER_DRAM).valid()              ? TM_TIER_DRAM
                                                                     : TM_TIER_NVME;
  for (io::FencePtr& f : core_.PendingUses(t, source)) buffer.after.push_back(std::move(f));
  if (t.landing.has_value() && t.landing_tier == source) buffer.after.push_back(t.landing->fence);
  if (source == TM_TIER_NVME) {
    // NVMe -> staging -> dst, pipelined; done when it returns. For the schedule, a use in DRAM:
    // a prefetch to DRAM ahead of it leaves only the last copy.
    const Extent e = t.copy(TM_TIER_NVME).extent;
    const uint64_t size = t.bytes;
    NvmeTally tally;
    const Trace::Clock::time_point start = Trace::Clock::now();
    absl::Status s = core_.Unlocked(
        t, [&] { return core_.mover()->ReadNvmeTo(e, size, r.offset, buffer, r.bytes, &tally); });
    TraceCallerNvme(*core_.trace(), t.name, tally, start);
    if (!s.ok()) {
      return WithContext(s, absl::StrFormat("%s: reading tensor \"%s\" from NVMe", r.fn, t.name));
    }
    prefetcher_.NoteUse(t, TM_TIER_DRAM, true);
    return absl::OkStatus();
  }
  char* addr = core_.tiers()->Address(source, t.copy(source).extent) + r.offset;
  auto copy = CopyTierAndCaller(t, source, addr, r, buffer, /*into_tier=*/false);
  if (!copy.ok()) return copy.status();
  write_through_.NoteCleanRead(t, source, r.bytes,
                               Trace::Clock::now());  // enqueued: when, not how long
  if (copy->has_value()) {
    // The source is not evicted, refilled or freed before the copy has read it.
    t.copy(source).uses.push_back((*copy)->fence);
    in_flight_.push_back(CopyInFlight{t.handle, t.name, "copy_out", **copy});
    if (r.stream != nullptr) {
      if (auto s = core_.mover()->copy_engine().StreamWait(r.stream, (*copy)->fence); !s.ok()) {
        return StreamError(s, r.fn, r.stream);
      }
    }
  }
  prefetcher_.NoteUse(t, source, true);
  return absl::OkStatus();
}

absl::Status CallerCopies::ReadZeros(Tensor& t, const CallerCopyRequest& r, CallerBuffer& buffer) {
  // Never written: zeros, once the stream's work so far is done (a host wait: a corner case).
  absl::Status s = core_.Unlocked(t, [&] {
    if (auto w = Retag(io::WaitAll(buffer.after), TM_ERR_DEVICE); !w.ok()) return w;
    if (!r.device) {
      std::memset(r.buffer, 0, r.bytes);
      return absl::OkStatus();
    }
    return Retag(core_.device()->Fill(r.buffer, 0, r.bytes), TM_ERR_DEVICE);
  });
  if (s.ok()) prefetcher_.NoteUse(t, TM_TIER_DRAM, true);
  return s;
}

absl::StatusOr<std::optional<io::CopyTicket>> CallerCopies::CopyTierAndCaller(
    Tensor& t, tm_tier tier, char* addr, const CallerCopyRequest& r, CallerBuffer& buffer,
    bool into_tier) {
  if (Overlap(addr, r.buffer, r.bytes)) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s: %s overlaps the bytes it is copied %s (tensor \"%s\"'s own "
                                 "copy in %s)",
                                 r.fn, into_tier ? "src" : "dst", into_tier ? "to" : "from", t.name,
                                 tm_tier_name(tier)));
  }
  const io::CopyDirection dir = Mover::Direction(tier, r.device, into_tier);
  char* dst = into_tier ? addr : r.buffer;
  const char* src = into_tier ? r.buffer : addr;
  if (dir == io::CopyDirection::kHostToHost && buffer.after.empty()) {
    // Host memory and the DRAM copy with nothing to wait for: a memcpy here is the copy, done
    // by the time the call returns (an engine would only add a hop and a thread).
    core_
        .Unlocked(t,
                  [&] {
                    std::memcpy(dst, src, r.bytes);
                    return absl::OkStatus();
                  })
        .IgnoreError();
    return std::optional<io::CopyTicket>();
  }
  absl::StatusOr<io::CopyTicket> ticket;
  absl::Status s = core_.Unlocked(t, [&] {
    ticket = core_.mover()->copy_engine().Enqueue(dir, dst, src, r.bytes, buffer.after);
    if (!ticket.ok() || !r.wait) return ticket.status();
    return core_.mover()->copy_engine().Wait(*ticket);
  });
  if (!s.ok()) {
    return WithContext(Retag(s, TM_ERR_DEVICE),
                       absl::StrFormat("%s: tensor \"%s\" %s %s", r.fn, t.name,
                                       into_tier ? "in" : "from", tm_tier_name(tier)));
  }
  if (r.wait) return std::optional<io::CopyTicket>();
  return std::optional<io::CopyTicket>(*ticket);
}

void CallerCopies::ReapCallerCopies(uint64_t handle, bool wait) {
  if (wait) {
    // Wait for the matching copies without taking them off the list: another thread's sync
    // that looks meanwhile must find them still there and wait too (taking them off first let
    // a tm_tensor_sync return while a tm_runtime_sync elsewhere was still waiting for its copy).
    std::vector<io::FencePtr> fences;
    for (const CopyInFlight& c : in_flight_) {
      if (handle == 0 || c.handle == handle) fences.push_back(c.ticket.fence);
    }
    if (!fences.empty()) {
      core_.Unlock();
      for (const io::FencePtr& f : fences) (void)f->Wait();
      core_.Lock();
    }
  }
  // Every copy that is done now leaves the list, its failure recorded once.
  std::erase_if(in_flight_, [&](CopyInFlight& c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (handle != 0 && c.handle != handle) return false;
    if (!c.ticket.fence->Passed()) return false;
    if (absl::Status s = c.ticket.fence->Wait(); !s.ok()) {
      ++counters_.moves_failed;
      ++counters_.moves_failed_lost;
      core_.RecordFailure(c.handle, c.tensor,
                          WithContext(Retag(s, TM_ERR_DEVICE),
                                      absl::StrFormat("%s of tensor \"%s\"", c.what, c.tensor)));
    }
    return true;
  });
}

}  // namespace tiermem
