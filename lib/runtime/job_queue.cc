// The asynchronous moves: offloads and prefetches queued, and the mover threads that run them.
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "io/log.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {

using io::Log;
using io::LogSeverity;

namespace {
// Offloads running at once: one of the kMoverThreads stays free for prefetches, which a
// scheduled use is waiting for, while slow writes to NVMe hold the others.
constexpr uint32_t kMaxRunningOffloads = static_cast<uint32_t>(kMoverThreads - 1);
}  // namespace

absl::Status Movers::Enqueue(uint64_t handle, tm_tier tier, JobKind kind) {
  CoreLock lock(core_);
  auto found = core_.Find(handle);
  if (!found.ok()) return found.status();
  Tensor& t = **found;
  if (kind == JobKind::kOffload) {
    // Said now rather than at sync when it is already certain.
    if (auto s = core_.CheckAboveUnpinned(t, tier); !s.ok()) return s;
  } else if (t.copy(tier).valid() && !t.busy()) {
    return absl::OkStatus();  // already there
  } else if (int w = t.writing_tier(); w >= 0) {
    return Error(TM_ERR_BUSY, absl::StrFormat("cannot prefetch tensor \"%s\": it is acquired for "
                                              "writing in %s",
                                              t.name, tm_tier_name(static_cast<tm_tier>(w))));
  }
  if (kind == JobKind::kOffload) parked_offloads_.erase(handle);  // this one replaces it
  ++t.queued;
  jobs_.Push(Job{handle, tier, kind});
  jobs_.Wake();
  return absl::OkStatus();
}

absl::Status Runtime::Prefetch(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_HBM && tier != TM_TIER_DRAM) {
    // Named as acquire names it ("not nvme"; a value that is no tier by its number).
    return Error(
        TM_ERR_INVALID_ARGUMENT,
        tier == TM_TIER_NVME
            ? std::string("prefetch needs tier hbm or dram, not nvme: a prefetch brings "
                          "a tensor up (offload sends it down)")
            : absl::StrFormat("prefetch needs tier hbm or dram, not %d", static_cast<int>(tier)));
  }
  return movers_.Enqueue(handle, tier, JobKind::kHint);
}

absl::Status Runtime::Offload(uint64_t handle, tm_tier tier) {
  if (tier != TM_TIER_DRAM && tier != TM_TIER_NVME) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("offload needs tier dram or nvme, not %d",
                                                          static_cast<int>(tier)));
  }
  return movers_.Enqueue(handle, tier, JobKind::kOffload);
}

void Movers::MoverLoop() {
  core_.device()->BindThread();
  // Takes this thread's malloc arena now, while the process can still map one: glibc makes a
  // thread's arena at its first allocation, and when that mmap is refused (a process at
  // vm.max_map_count) every allocation of the thread fails, and a std::bad_alloc on a mover
  // would end the process instead of failing a move.
  void* volatile arena_probe = std::malloc(1);
  std::free(arena_probe);
  CoreLock lock(core_);
  for (;;) {
    std::optional<Job> next;
    while (!stopping_ && !(next = jobs_.Pop(kMaxRunningOffloads)).has_value()) jobs_.WaitForWork();
    if (stopping_) return;
    const Job job = *next;
    // More work ready than this job: another mover takes it (the queuer woke only this one).
    if (jobs_.HasRunnable(kMaxRunningOffloads)) jobs_.Wake();
    // An offload is a request: it may need room below, so it takes the room token before
    // claiming its tensor, as a demand does. Prefetches never wait for room.
    std::optional<RoomScope> room;
    if (job.kind == JobKind::kOffload) room.emplace(core_, job.handle);
    // The job stays counted in `queued` until it is done, so that Sync waits for it.
    auto claimed = core_.Claim(job.handle);  // gone: destroyed since it was queued
    bool landed = false;                     // a prefetch that made its copy
    if (claimed.ok()) {
      Tensor& t = **claimed;
      const bool was_valid = t.copy(job.tier).valid();
      absl::Status s = RunJob(t, job);
      landed = job.kind == JobKind::kPrefetch && !was_valid && t.copy(job.tier).valid();
      --t.queued;
      if (!s.ok() && job.kind == JobKind::kOffload && absl::IsResourceExhausted(s) &&
          AnyPinned(job.tier)) {
        // Copies callers hold there split the room; they are let go soon, as a rule.
        parked_offloads_[job.handle] = job.tier;
        ++counters_.offloads_parked;
        Log(LogSeverity::kDebug, "offload of \"%s\" to %s waits for a release: %s", t.name.c_str(),
            tm_tier_name(job.tier), std::string(s.message()).c_str());
      } else if (!s.ok()) {
        Log(LogSeverity::kDebug, "async %s of \"%s\" to %s failed: %s",
            job.kind == JobKind::kOffload ? "offload" : "prefetch", t.name.c_str(),
            tm_tier_name(job.tier), std::string(s.message()).c_str());
        core_.RecordFailure(t, s);
      }
    }
    room.reset();
    jobs_.Done(job);
    if (job.kind == JobKind::kOffload && jobs_.HasRunnable(kMaxRunningOffloads))
      jobs_.Wake();  // one waited for this offload's slot
    // Look ahead again now, without waiting for the next use: after an offload, a scheduled use
    // skipped while an offload of its tensor was queued can be prefetched; after a prefetch that
    // landed, one held back by the bytes in flight (TIERMEM_PREFETCH_BYTES) can go, so that the
    // link does not idle until the caller's next acquire. (Not after a dropped prefetch: it would
    // only queue the same prefetch again.)
    if (job.kind == JobKind::kOffload || landed) prefetcher_.IssuePrefetches();
    core_.NotifyChanged();
  }
}

bool Movers::AnyPinned(tm_tier tier) {
  bool pinned = false;
  core_.ForEachTensor([&](const Tensor& t) { pinned = pinned || t.copy(tier).pins > 0; });
  return pinned;
}

void Movers::Start(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { MoverLoop(); });
}

void Movers::Stop() {
  {
    CoreLock lock(core_);
    stopping_ = true;
    jobs_.RemoveIf([](const Job&) { return true; });  // queued moves are abandoned; running
                                                      // ones finish
    jobs_.WakeAll();
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void Movers::Forget(uint64_t handle) {
  parked_offloads_.erase(handle);
  RequeueParkedOffloads(std::nullopt);  // its room is free now
}

void Movers::Drain() {
  // Parked offloads run here, one at a time; a release meanwhile may queue the others again,
  // so the queue is waited for again after each (a parked one run here never parks again).
  for (;;) {
    while (jobs_.outstanding() > 0) core_.WaitForChange();
    if (parked_offloads_.empty()) return;
    RunParkedOffload(parked_offloads_.begin()->first);
  }
}

void Movers::RequeueParkedOffloads(std::optional<tm_tier> freed) {
  if (parked_offloads_.empty()) return;
  for (auto it = parked_offloads_.begin(); it != parked_offloads_.end();) {
    const auto [handle, tier] = *it;
    if (freed.has_value() && *freed != tier) {
      ++it;
      continue;
    }
    parked_offloads_.erase(it++);
    if (Tensor* t = core_.Lookup(handle); t != nullptr) {
      ++t->queued;
      jobs_.Push(Job{handle, tier, JobKind::kOffload});
    }
  }
  jobs_.WakeAll();
}

void Movers::RunParkedOffload(uint64_t handle) {
  auto parked = parked_offloads_.find(handle);
  if (parked == parked_offloads_.end()) return;
  const Job job{handle, parked->second, JobKind::kOffload};
  parked_offloads_.erase(parked);
  RoomScope room(core_, handle);
  auto claimed = core_.Claim(handle);
  if (!claimed.ok()) return;  // destroyed meanwhile: nothing to move
  if (absl::Status s = RunJob(**claimed, job); !s.ok()) core_.RecordFailure(**claimed, s);
}

absl::Status Movers::RunJob(Tensor& t, const Job& job) {
  if (job.kind == JobKind::kOffload) {
    // Acquired again since the offload was queued and still held (one released by now does
    // not count: the offload runs, as asked), or (while it waited for a mover or the room
    // token) now used within the prefetch stages: the newer use supersedes it.
    if (!core_.CheckAboveUnpinned(t, job.tier).ok() || prefetcher_.UsedSoon(t))
      return absl::OkStatus();
    return moves_.OffloadClaimed(t, job.tier);
  }
  const Trace::Clock::time_point start = Trace::Clock::now();
  absl::Status s;
  DropReason why = DropReason::kNone;
  std::string reason;  // for the trace
  if (t.writing_tier() >= 0) {
    // Acquired for writing since the job was queued: the writer's newer bytes supersede it.
    why = DropReason::kSuperseded;
    if (core_.trace()->enabled()) {
      reason = absl::StrFormat(
          "prefetch of tensor \"%s\" to %s dropped: acquired for writing "
          "since it was queued",
          t.name, tm_tier_name(job.tier));
    }
  } else {
    const Want want = job.kind == JobKind::kPrefetch ? Want{Want::kPrefetch, job.horizon}
                                                     : Want{Want::kHint, Schedule::kNever};
    s = moves_.MakeValid(t, job.tier, {}, want, &why);
    // A prefetch is a hint: one that found no room is dropped and counted, not a failure.
    if (!s.ok() && (why != DropReason::kNone || absl::IsResourceExhausted(s))) {
      if (why == DropReason::kNone) why = DropReason::kNoRoom;
      if (core_.trace()->enabled()) reason = std::string(s.message());
      s = absl::OkStatus();
    }
  }
  if (why != DropReason::kNone) {
    counters_.CountDrop(why);
    core_.trace()->Add(Trace::kPrefetchDrop, t.name, start, Trace::Clock::now(), t.bytes,
                       std::move(reason));
  }
  return s;
}

}  // namespace tiermem
