// Recompute callbacks (tm_tensor_set_recompute): a tensor whose only copy would be written down to
// make room is dropped instead when its caller-measured rebuild costs less than the round trip
// it saves; the next operation that needs its bytes calls the callback to rebuild them.
//
// The rule: drop when cost_seconds < bytes / down + bytes / up, both at the bandwidth of the
// link to the tier the copy would be written to (TIERMEM_LINK_GBPS from HBM, TIERMEM_NVME_GBPS
// from DRAM). The callback runs on the thread of the operation that needs the bytes, with the
// tensor busy (so that no other operation touches it) and without the runtime's lock: it may
// take as long as a forward pass and may itself use tiermem's other tensors.
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "lib/runtime/runtime.h"
#include "lib/runtime/runtime_internal.h"

namespace tiermem {
namespace {

// Without a figure in the settings (docs/environment.md): a PCIe Gen4 x16 link, one Gen4 drive.
constexpr double kDefaultLinkGbps = 25;
constexpr double kDefaultNvmeGbps = 3;

// Calls the caller's callback; an exception or a value that is no tm_status is its failure.
tm_status CallRecompute(const Tensor::Recompute& hook, uint64_t handle, tm_tier tier, void* dst,
                        uint64_t bytes, void* stream, int* returned) {
  tm_status code = TM_ERR_INTERNAL;
  try {
    code = hook.fn(hook.user, tm_tensor{handle}, tier, dst, bytes, stream);
  } catch (...) {
    *returned = -1;
    return TM_ERR_INVALID_ARGUMENT;
  }
  *returned = static_cast<int>(code);
  if (code == TM_OK || (code > TM_OK && code < TM_STATUS_COUNT)) return code;
  return TM_ERR_INVALID_ARGUMENT;
}

}  // namespace

double RecomputeCallbacks::RecomputeGbps(tm_tier tier) const {
  if (tier == TM_TIER_HBM) {
    if (core_.config().link_gbps > 0) return core_.config().link_gbps;
    if (core_.info().device_kind == "emulated" && core_.config().emu_link_gbps > 0)
      return core_.config().emu_link_gbps;
    return kDefaultLinkGbps;
  }
  return core_.config().nvme_gbps > 0 ? core_.config().nvme_gbps : kDefaultNvmeGbps;
}

bool RecomputeCallbacks::DropsForRecompute(const Tensor& t, tm_tier tier) const {
  if (t.recompute.fn == nullptr || tier == TM_TIER_NVME) return false;  // NVMe is never evicted
  const TensorCopy& c = t.copy(tier);
  if (c.state != CopyState::kValid || c.pins > 0 || !t.only_copy(tier)) return false;
  const double round_trip = 2.0 * static_cast<double>(t.bytes) / (RecomputeGbps(tier) * 1e9);
  return t.recompute.cost_seconds < round_trip;
}

void RecomputeCallbacks::DropForRecompute(Tensor& v, tm_tier tier, Trace::Clock::time_point start) {
  core_.FreeCopy(v, tier);
  v.dropped = true;
  ++counters_.evictions;
  counters_.eviction_bytes += v.bytes;
  ++counters_.recompute_drops;
  counters_.recompute_drop_bytes += v.bytes;
  core_.trace()->Add(Trace::kRecomputeDrop, v.name, start, Trace::Clock::now(), v.bytes);
}

absl::Status RecomputeCallbacks::CheckRebuild(const Tensor& t, tm_tier dst, Want want,
                                              DropReason* why) const {
  if (want.kind != Want::kDemand) {
    // Only an operation that needs the bytes rebuilds them, on its own thread.
    if (why != nullptr) *why = DropReason::kNoRoom;
    return Error(TM_ERR_OUT_OF_MEMORY,
                 absl::StrFormat("prefetch of tensor \"%s\" to %s dropped: it was dropped for "
                                 "recompute, and only a use of its bytes rebuilds it",
                                 t.name, tm_tier_name(dst)));
  }
  if (t.lost && (dst == TM_TIER_NVME || t.recompute.fn == nullptr)) {
    return Error(TM_ERR_DEVICE,
                 absl::StrFormat("tensor \"%s\" lost its bytes: the device failed its copy down "
                                 "from HBM after that memory was handed on; a whole write (an "
                                 "acquire for writing, tm_tensor_copy_in of all of it) or a "
                                 "recompute callback makes it usable again",
                                 t.name));
  }
  if (dst == TM_TIER_NVME || t.recompute.fn == nullptr) {
    return Error(TM_ERR_INTERNAL,
                 absl::StrFormat("tensor \"%s\" was dropped for recompute and is to be rebuilt in "
                                 "%s%s",
                                 t.name, tm_tier_name(dst),
                                 t.recompute.fn == nullptr ? " without a callback" : ""));
  }
  return absl::OkStatus();
}

absl::Status RecomputeCallbacks::Fill(Tensor& t, tm_tier dst, const Extent& extent,
                                      const CallerStream& caller) {
  t.BeginFill(dst, extent);
  const Tensor::Recompute hook = t.recompute;
  const uint64_t handle = t.handle, bytes = t.bytes;
  void* addr = core_.tiers()->Address(dst, extent);
  int returned = 0;
  core_.Unlock();
  const Trace::Clock::time_point start = Trace::Clock::now();
  const tm_status code = CallRecompute(hook, handle, dst, addr, bytes, caller.stream, &returned);
  const Trace::Clock::time_point end = Trace::Clock::now();
  core_.Lock();
  counters_.recompute_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
  core_.trace()->Add(Trace::kRecompute, t.name, start, end, bytes);
  if (code != TM_OK) {
    // Whatever it wrote is no copy: freed, and the tensor stays dropped for a later try.
    core_.FreeCopy(t, dst);
    ++counters_.recompute_failures;
    const std::string what =
        returned == -1 ? std::string("threw an exception (a callback must return a tm_status)")
        : code == static_cast<tm_status>(returned)
            ? absl::StrFormat("returned %s", tm_status_string(code))
            : absl::StrFormat("returned %d, which is no tm_status", returned);
    return Error(code, absl::StrFormat("the recompute callback of tensor \"%s\" (%s into %s) %s: "
                                       "the tensor stays dropped, and its next use calls the "
                                       "callback again",
                                       t.name, HumanBytes(bytes), tm_tier_name(dst), what));
  }
  t.EndFill(dst);
  ++counters_.recomputes;
  return absl::OkStatus();
}

tm_tier RecomputeCallbacks::RebuildTier(const Tensor& t) const {
  // Callers' copies go through host memory most cheaply: DRAM, else HBM for a tensor larger than
  // the whole DRAM tier. Chosen up front: the demand hands the room token back once its room is
  // made, so a second try would make room without it.
  return core_.tiers()->space(TM_TIER_DRAM).Rounded(t.bytes) != 0 ? TM_TIER_DRAM : TM_TIER_HBM;
}

absl::Status Runtime::SetRecompute(uint64_t handle, tm_recompute_fn fn, void* user,
                                   double cost_seconds) {
  if (!std::isfinite(cost_seconds) || cost_seconds < 0) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_tensor_set_recompute: cost_seconds is %g: it must be a finite "
                                 "number of seconds, 0 or more",
                                 cost_seconds));
  }
  if (fn == nullptr && cost_seconds != 0) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_tensor_set_recompute: fn is NULL (clearing the callback) but "
                                 "cost_seconds is %g: a cost needs a callback; clear with 0",
                                 cost_seconds));
  }
  CoreLock lock(core_);
  // Clearing rebuilds a dropped tensor first, which takes room: the token comes before the claim.
  std::optional<RoomScope> room;
  if (fn == nullptr) room.emplace(core_, handle);
  auto claimed = core_.Claim(handle);
  if (!claimed.ok()) return claimed.status();
  Tensor& t = **claimed;
  if (fn == nullptr && t.dropped) {
    if (auto s = moves_.MakeValid(t, recompute_.RebuildTier(t), {}, Demand()); !s.ok()) {
      return WithContext(s, absl::StrFormat("tm_tensor_set_recompute: clearing the callback of "
                                            "dropped tensor \"%s\" rebuilds it first (the "
                                            "callback stays)",
                                            t.name));
    }
  }
  t.recompute = Tensor::Recompute{fn, user, cost_seconds};
  return absl::OkStatus();
}

}  // namespace tiermem
