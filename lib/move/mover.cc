// The move paths between tiers.
#include "lib/move/mover.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem {

using io::CopyDirection;
using io::CopyTicket;

void Mover::Count(const MovePlan& p) {
  if (p.src < 0) return;
  if (std::abs(p.src - static_cast<int>(p.dst)) == 2) {  // staged: both hops crossed a link
    moved_[p.src][TM_TIER_DRAM] += p.bytes;
    moved_[TM_TIER_DRAM][p.dst] += p.bytes;
  } else {
    moved_[p.src][p.dst] += p.bytes;
  }
}

absl::Status Mover::Io(const Extent& e, uint64_t offset, char* buffer, uint64_t n, bool write) {
  // Also records (write) or checks (read) the extent's checksums when they are on.
  return tiers_.nvme().Transfer(io_, e, offset, buffer, n, write);
}

absl::Status Mover::CountedIo(const Extent& e, uint64_t offset, char* buffer, uint64_t n,
                              bool write, NvmeTally* tally) {
  // The caller copies' own NVMe legs: the staging slot is DRAM, so each chunk crosses the
  // DRAM <-> NVMe boundary (no MovePlan passes through Count for them).
  absl::Status s = Io(e, offset, buffer, n, write);
  if (s.ok()) {
    std::atomic<uint64_t>& to =
        write ? moved_[TM_TIER_DRAM][TM_TIER_NVME] : moved_[TM_TIER_NVME][TM_TIER_DRAM];
    to += n;
    (write ? tally->written : tally->read) += n;
  }
  return s;
}

absl::Status Mover::Execute(const MovePlan& p, std::optional<CopyTicket>* pending) {
  absl::Status s = ExecuteUncounted(p, pending);
  if (s.ok()) Count(p);
  return s;
}

absl::Status Mover::EnqueuePieces(CopyDirection dir, char* dst, const char* src, uint64_t bytes,
                                  const std::vector<io::FencePtr>& after,
                                  const std::vector<RangeFence>& behind,
                                  std::vector<CopyTicket>* pieces) {
  io::CopyEngine& copy = device_.copy_engine();
  absl::Status status;
  for (uint64_t off = 0; off < bytes; off += MovePlan::kPiece) {
    const uint64_t n = std::min(MovePlan::kPiece, bytes - off);
    // Each piece after the one before (a lane that interleaves copies would otherwise finish
    // them all at the end), after the fences over its own bytes, and the first after `after`.
    std::vector<io::FencePtr> wait = pieces->empty() ? after : std::vector<io::FencePtr>{};
    if (!pieces->empty()) wait.push_back(pieces->back().fence);
    for (const RangeFence& r : behind) {
      if (r.offset < off + n && off < r.offset + r.size) wait.push_back(r.fence);
    }
    auto t = copy.Enqueue(dir, dst + off, src + off, n, wait);
    if (!t.ok()) {
      status = Retag(t.status(), TM_ERR_DEVICE);
      break;
    }
    pieces->push_back(*std::move(t));
  }
  if (!status.ok()) {  // nothing of the copy is left running: drain what was enqueued
    for (const CopyTicket& t : *pieces) (void)copy.Wait(t);
  }
  return status;
}

absl::Status Mover::WaitPieces(const std::vector<CopyTicket>& pieces) {
  absl::Status first;
  for (const CopyTicket& t : pieces) {
    absl::Status s = Retag(device_.copy_engine().Wait(t), TM_ERR_DEVICE);
    if (first.ok()) first = s;
  }
  return first;
}

std::optional<absl::Status> Mover::ExecutePieces(const MovePlan& plan,
                                                 std::optional<CopyTicket>* pending) {
  const bool by_engine = plan.src >= 0 && plan.src != TM_TIER_NVME && plan.dst != TM_TIER_NVME;
  // Into HBM from DRAM, host-waited: up piece by piece behind the copy down it follows.
  const bool up_behind =
      by_engine && plan.dst == TM_TIER_HBM && plan.stream == nullptr && !plan.behind.empty();
  if (up_behind) {
    std::vector<CopyTicket> pieces;
    if (auto s = EnqueuePieces(CopyDirection::kHostToDevice, plan.dst_addr, plan.src_addr,
                               plan.bytes, plan.after, plan.behind, &pieces);
        !s.ok()) {
      return s;
    }
    if (plan.on_enqueued && !pieces.empty()) plan.on_enqueued(pieces.back().fence);
    return WaitPieces(pieces);
  }
  if (by_engine && plan.src == TM_TIER_HBM && plan.on_vacate) {
    std::vector<CopyTicket> pieces;
    if (auto s = EnqueuePieces(CopyDirection::kDeviceToHost, plan.dst_addr, plan.src_addr,
                               plan.bytes, plan.after, {}, &pieces);
        !s.ok()) {
      return s;
    }
    std::vector<RangeFence> vacating;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const uint64_t off = i * MovePlan::kPiece;
      vacating.push_back(
          RangeFence{off, std::min(MovePlan::kPiece, plan.bytes - off), pieces[i].fence});
    }
    if (plan.on_vacate(std::move(vacating)) && plan.lands && pending != nullptr) {
      *pending = pieces.back();
      return absl::OkStatus();
    }
    return WaitPieces(pieces);
  }
  return std::nullopt;
}

absl::Status Mover::ExecuteUncounted(const MovePlan& plan, std::optional<CopyTicket>* pending) {
  if (std::optional<absl::Status> s = ExecutePieces(plan, pending)) return *s;
  io::CopyEngine& copy = device_.copy_engine();
  const bool by_engine = plan.src >= 0 && plan.src != TM_TIER_NVME && plan.dst != TM_TIER_NVME;
  // Every other path waits for the whole of what its destination is behind.
  MovePlan merged;
  if (!plan.behind.empty()) {
    merged = plan;
    for (const RangeFence& r : plan.behind) merged.after.push_back(r.fence);
  }
  const MovePlan& p = plan.behind.empty() ? plan : merged;
  if (!by_engine) {  // the host reads or writes: the fences pass first
    if (auto s = Retag(io::WaitAll(p.after), TM_ERR_DEVICE); !s.ok()) return s;
  }
  if (p.src < 0) {  // zeros
    switch (p.dst) {
      case TM_TIER_HBM:
        return Retag(device_.Fill(p.dst_addr, 0, p.dst_extent.size), TM_ERR_DEVICE);
      case TM_TIER_DRAM:
        std::memset(p.dst_addr, 0, p.dst_extent.size);
        return absl::OkStatus();
      default:
        return StagedWrite(Extent{}, p.dst_extent, p.bytes, 0, CallerBuffer{}, 0, nullptr);
    }
  }
  const tm_tier src = static_cast<tm_tier>(p.src);
  if (src == TM_TIER_NVME && p.dst == TM_TIER_HBM) {
    return StagedRead(p.src_extent, p.bytes, 0, CallerBuffer{p.dst_addr, true, {}}, p.bytes,
                      nullptr);
  }
  if (src == TM_TIER_HBM && p.dst == TM_TIER_NVME) {
    return StagedWrite(Extent{}, p.dst_extent, p.bytes, 0, CallerBuffer{p.src_addr, true, {}},
                       p.bytes, nullptr);
  }
  if (src == TM_TIER_NVME) return Io(p.src_extent, 0, p.dst_addr, p.bytes, false);
  if (p.dst == TM_TIER_NVME) return Io(p.dst_extent, 0, p.src_addr, p.bytes, true);
  const CopyDirection dir =
      p.dst == TM_TIER_HBM ? CopyDirection::kHostToDevice : CopyDirection::kDeviceToHost;
  auto ticket = copy.Enqueue(dir, p.dst_addr, p.src_addr, p.bytes, p.after);
  if (!ticket.ok()) return Retag(ticket.status(), TM_ERR_DEVICE);
  if (p.on_enqueued) p.on_enqueued(ticket->fence);
  if ((p.stream != nullptr || p.enqueue_only) && dir == CopyDirection::kHostToDevice &&
      pending != nullptr) {
    // The caller's stream waits; the host does not. A stream that cannot wait (the runtime
    // checked it before, so only a device failure) is reported, after the copy has drained.
    if (absl::Status s =
            p.stream != nullptr ? copy.StreamWait(p.stream, ticket->fence) : absl::OkStatus();
        !s.ok()) {
      (void)copy.Wait(*ticket);
      return Retag(s, TM_ERR_DEVICE);
    }
    *pending = *ticket;
    return absl::OkStatus();
  }
  return Retag(copy.Wait(*ticket), TM_ERR_DEVICE);
}

// NVMe -> staging -> dst: chunk k+1 is read into one slot while chunk k is copied out of the
// other (a device destination; into host memory the copy is a memcpy here).
absl::Status Mover::StagedRead(const Extent& e, uint64_t bytes, uint64_t offset,
                               const CallerBuffer& dst, uint64_t n, NvmeTally* tally) {
  if (!dst.device) {  // the host copies: what the destination waits for passes first
    if (auto s = Retag(io::WaitAll(dst.after), TM_ERR_DEVICE); !s.ok()) return s;
  }
  io::CopyEngine& copy = device_.copy_engine();
  const uint64_t chunk = staging_.chunk();
  const StagingRing::Lease slots = staging_.Acquire(2);
  std::optional<CopyTicket> in_flight[2];
  absl::Status status;
  uint64_t i = 0;
  for (uint64_t k = offset / chunk; k * chunk < offset + n && status.ok(); ++k, ++i) {
    const int slot = static_cast<int>(i % 2);
    if (in_flight[slot].has_value()) {  // the slot's previous chunk must have left it
      status = Retag(copy.Wait(*in_flight[slot]), TM_ERR_DEVICE);
      in_flight[slot].reset();
      if (!status.ok()) break;
    }
    const uint64_t start = k * chunk;
    const uint64_t len = std::min(chunk, bytes - start);
    status = tally != nullptr ? CountedIo(e, start, slots[slot], len, false, tally)
                              : Io(e, start, slots[slot], len, false);
    if (!status.ok()) break;
    const uint64_t from = std::max(start, offset);
    const uint64_t to = std::min(start + chunk, offset + n);
    if (!dst.device) {
      std::memcpy(dst.addr + (from - offset), slots[slot] + (from - start), to - from);
      continue;
    }
    auto t = copy.Enqueue(CopyDirection::kHostToDevice, dst.addr + (from - offset),
                          slots[slot] + (from - start), to - from, dst.after);
    if (!t.ok()) {
      status = Retag(t.status(), TM_ERR_DEVICE);
      break;
    }
    in_flight[slot] = *t;
  }
  for (auto& t : in_flight) {  // never hand a slot back with a copy still writing from it
    if (!t.has_value()) continue;
    absl::Status s = Retag(copy.Wait(*t), TM_ERR_DEVICE);
    if (status.ok()) status = s;
  }
  return status;
}

// src -> staging -> NVMe: chunk k+1 is copied into one slot while chunk k is written from the
// other. A chunk that src covers only in part is read from `old` (or zeroed) first.
absl::Status Mover::StagedWrite(const Extent& old, const Extent& fresh, uint64_t bytes,
                                uint64_t offset, const CallerBuffer& src, uint64_t n,
                                NvmeTally* tally) {
  auto io = [&](const Extent& e, uint64_t at, char* buffer, uint64_t len, bool write) {
    return tally != nullptr ? CountedIo(e, at, buffer, len, write, tally)
                            : Io(e, at, buffer, len, write);
  };
  if (auto s = Retag(io::WaitAll(src.after), TM_ERR_DEVICE); !s.ok()) return s;
  io::CopyEngine& copy = device_.copy_engine();
  const uint64_t chunk = staging_.chunk();
  const StagingRing::Lease slots = staging_.Acquire(2);
  std::optional<CopyTicket> filling[2];
  auto fill = [&](uint64_t k) -> absl::Status {
    char* slot = slots[k % 2];
    const uint64_t start = k * chunk, len = std::min(chunk, bytes - start);
    const uint64_t from = std::max(start, offset), to = std::min(start + len, offset + n);
    if (from >= to || from != start || to != start + len) {  // not all of it comes from src
      if (old.empty()) {
        std::memset(slot, 0, len);
      } else if (auto s = io(old, start, slot, len, false); !s.ok()) {
        return s;
      }
    }
    if (from >= to) return absl::OkStatus();
    if (!src.device) {
      std::memcpy(slot + (from - start), src.addr + (from - offset), to - from);
      return absl::OkStatus();
    }
    auto t = copy.Enqueue(CopyDirection::kDeviceToHost, slot + (from - start),
                          src.addr + (from - offset), to - from);
    if (!t.ok()) return Retag(t.status(), TM_ERR_DEVICE);
    filling[k % 2] = *t;
    return absl::OkStatus();
  };
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  absl::Status status = chunks > 0 ? fill(0) : absl::OkStatus();
  for (uint64_t k = 0; k < chunks && status.ok(); ++k) {
    const int slot = static_cast<int>(k % 2);
    if (filling[slot].has_value()) {
      status = Retag(copy.Wait(*filling[slot]), TM_ERR_DEVICE);
      filling[slot].reset();
      if (!status.ok()) break;
    }
    if (k + 1 < chunks && !(status = fill(k + 1)).ok()) break;
    status = io(fresh, k * chunk, slots[slot], std::min(chunk, bytes - k * chunk), true);
  }
  for (auto& t : filling) {  // never hand a slot back with a copy still writing into it
    if (t.has_value()) (void)copy.Wait(*t);
  }
  return status;
}

absl::Status Mover::ReadNvmeTo(const Extent& e, uint64_t bytes, uint64_t offset,
                               const CallerBuffer& dst, uint64_t n, NvmeTally* tally) {
  return StagedRead(e, bytes, offset, dst, n, tally);
}

absl::Status Mover::WriteNvmeFrom(const Extent& old, const Extent& fresh, uint64_t bytes,
                                  uint64_t offset, const CallerBuffer& src, uint64_t n,
                                  NvmeTally* tally) {
  return StagedWrite(old, fresh, bytes, offset, src, n, tally);
}

CopyDirection Mover::Direction(tm_tier tier, bool caller_device, bool into_tier) {
  const bool tier_device = tier == TM_TIER_HBM;
  const bool from_device = into_tier ? caller_device : tier_device;
  const bool to_device = into_tier ? tier_device : caller_device;
  if (from_device) return to_device ? CopyDirection::kDeviceToDevice : CopyDirection::kDeviceToHost;
  return to_device ? CopyDirection::kHostToDevice : CopyDirection::kHostToHost;
}

}  // namespace tiermem
