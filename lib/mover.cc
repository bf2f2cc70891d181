// The move paths between tiers.
#include "lib/mover.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "lib/status.h"

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
                              bool write) {
  // The caller copies' own NVMe legs: the staging slot is DRAM, so each chunk crosses the
  // DRAM <-> NVMe boundary (no MovePlan passes through Count for them).
  absl::Status s = Io(e, offset, buffer, n, write);
  if (s.ok()) {
    std::atomic<uint64_t>& to =
        write ? moved_[TM_TIER_DRAM][TM_TIER_NVME] : moved_[TM_TIER_NVME][TM_TIER_DRAM];
    to += n;
  }
  return s;
}

absl::Status Mover::Execute(const MovePlan& p, std::optional<CopyTicket>* pending) {
  absl::Status s = ExecuteUncounted(p, pending);
  if (s.ok()) Count(p);
  return s;
}

absl::Status Mover::ExecuteUncounted(const MovePlan& p, std::optional<CopyTicket>* pending) {
  io::CopyEngine& copy = device_.copy_engine();
  const bool by_engine = p.src >= 0 && p.src != TM_TIER_NVME && p.dst != TM_TIER_NVME;
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
        return ZeroNvme(p.dst_extent, p.bytes);
    }
  }
  const tm_tier src = static_cast<tm_tier>(p.src);
  if (src == TM_TIER_NVME && p.dst == TM_TIER_HBM)
    return StagedUp(p.src_extent, p.dst_addr, p.bytes);
  if (src == TM_TIER_HBM && p.dst == TM_TIER_NVME)
    return StagedDown(p.src_addr, p.dst_extent, p.bytes);
  if (src == TM_TIER_NVME) return Io(p.src_extent, 0, p.dst_addr, p.bytes, false);
  if (p.dst == TM_TIER_NVME) return Io(p.dst_extent, 0, p.src_addr, p.bytes, true);
  const CopyDirection dir =
      p.dst == TM_TIER_HBM ? CopyDirection::kHostToDevice : CopyDirection::kDeviceToHost;
  auto ticket = copy.Enqueue(dir, p.dst_addr, p.src_addr, p.bytes, p.after);
  if (!ticket.ok()) return Retag(ticket.status(), TM_ERR_DEVICE);
  if (p.stream != nullptr && dir == CopyDirection::kHostToDevice && pending != nullptr) {
    // The caller's stream waits; the host does not. A stream that cannot wait (the runtime
    // checked it before, so only a device failure) is reported, after the copy has drained.
    if (absl::Status s = copy.StreamWait(p.stream, ticket->fence); !s.ok()) {
      (void)copy.Wait(*ticket);
      return Retag(s, TM_ERR_DEVICE);
    }
    *pending = *ticket;
    return absl::OkStatus();
  }
  return Retag(copy.Wait(*ticket), TM_ERR_DEVICE);
}

// NVMe -> HBM: chunk k+1 is read into one slot while chunk k is copied up from the other.
absl::Status Mover::StagedUp(const Extent& src, char* dst, uint64_t bytes) {
  io::CopyEngine& copy = device_.copy_engine();
  const uint64_t chunk = staging_.chunk();
  std::vector<char*> slots = staging_.Acquire(2);
  std::optional<CopyTicket> in_flight[2];
  absl::Status status;
  for (uint64_t k = 0, off = 0; off < bytes && status.ok(); ++k, off += chunk) {
    const int slot = static_cast<int>(k % 2);
    if (in_flight[slot].has_value()) {  // the slot's previous chunk must have left it
      status = Retag(copy.Wait(*in_flight[slot]), TM_ERR_DEVICE);
      in_flight[slot].reset();
      if (!status.ok()) break;
    }
    const uint64_t n = std::min(chunk, bytes - off);
    status = Io(src, off, slots[slot], n, false);
    if (!status.ok()) break;
    auto t = copy.Enqueue(CopyDirection::kHostToDevice, dst + off, slots[slot], n);
    if (!t.ok()) {
      status = Retag(t.status(), TM_ERR_DEVICE);
      break;
    }
    in_flight[slot] = *t;
  }
  // Never hand a slot back with a copy still reading it.
  for (auto& t : in_flight) {
    if (!t.has_value()) continue;
    absl::Status s = Retag(copy.Wait(*t), TM_ERR_DEVICE);
    if (status.ok()) status = s;
  }
  staging_.Release(slots);
  return status;
}

// HBM -> NVMe: chunk k+1 is copied down into one slot while chunk k is written from the other.
absl::Status Mover::StagedDown(const char* src, const Extent& dst, uint64_t bytes) {
  io::CopyEngine& copy = device_.copy_engine();
  const uint64_t chunk = staging_.chunk();
  std::vector<char*> slots = staging_.Acquire(2);
  std::optional<CopyTicket> in_flight[2];
  absl::Status status;
  auto start = [&](uint64_t k) {
    const uint64_t off = k * chunk;
    auto t = copy.Enqueue(CopyDirection::kDeviceToHost, slots[k % 2], src + off,
                          std::min(chunk, bytes - off));
    if (!t.ok()) return Retag(t.status(), TM_ERR_DEVICE);
    in_flight[k % 2] = *t;
    return absl::OkStatus();
  };
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  status = start(0);
  for (uint64_t k = 0; k < chunks && status.ok(); ++k) {
    const int slot = static_cast<int>(k % 2);
    status = Retag(copy.Wait(*in_flight[slot]), TM_ERR_DEVICE);
    in_flight[slot].reset();
    if (!status.ok()) break;
    if (k + 1 < chunks && !(status = start(k + 1)).ok()) break;
    const uint64_t off = k * chunk;
    status = Io(dst, off, slots[slot], std::min(chunk, bytes - off), true);
  }
  for (auto& t : in_flight) {
    if (t.has_value()) (void)copy.Wait(*t);
  }
  staging_.Release(slots);
  return status;
}

absl::Status Mover::ZeroNvme(const Extent& dst, uint64_t bytes) {
  const uint64_t chunk = staging_.chunk();
  std::vector<char*> slot = staging_.Acquire(1);
  std::memset(slot[0], 0, chunk);
  absl::Status status;
  for (uint64_t off = 0; off < bytes && status.ok(); off += chunk) {
    status = Io(dst, off, slot[0], std::min(chunk, bytes - off), true);
  }
  staging_.Release(slot);
  return status;
}

absl::Status Mover::ReadNvme(const Extent& e, uint64_t bytes, uint64_t offset, void* dst,
                             uint64_t n) {
  const uint64_t chunk = staging_.chunk();
  std::vector<char*> slot = staging_.Acquire(1);
  absl::Status status;
  for (uint64_t k = offset / chunk; k * chunk < offset + n && status.ok(); ++k) {
    const uint64_t start = k * chunk;
    status = CountedIo(e, start, slot[0], std::min(chunk, bytes - start), false);
    if (!status.ok()) break;
    const uint64_t from = std::max(start, offset);
    const uint64_t to = std::min(start + chunk, offset + n);
    std::memcpy(static_cast<char*>(dst) + (from - offset), slot[0] + (from - start), to - from);
  }
  staging_.Release(slot);
  return status;
}

absl::Status Mover::WriteNvme(const Extent& old, const Extent& fresh, uint64_t bytes,
                              uint64_t offset, const void* src, uint64_t n) {
  CallerBuffer b;
  b.addr = static_cast<char*>(const_cast<void*>(src));
  return WriteNvmeFrom(old, fresh, bytes, offset, b, n);
}

CopyDirection Mover::Direction(tm_tier tier, bool caller_device, bool into_tier) {
  const bool tier_device = tier == TM_TIER_HBM;
  const bool from_device = into_tier ? caller_device : tier_device;
  const bool to_device = into_tier ? tier_device : caller_device;
  if (from_device) return to_device ? CopyDirection::kDeviceToDevice : CopyDirection::kDeviceToHost;
  return to_device ? CopyDirection::kHostToDevice : CopyDirection::kHostToHost;
}

absl::Status Mover::ReadNvmeTo(const Extent& e, uint64_t bytes, uint64_t offset,
                               const CallerBuffer& dst, uint64_t n) {
  io::CopyEngine& copy = device_.copy_engine();
  const CopyDirection dir = dst.device ? CopyDirection::kHostToDevice : CopyDirection::kHostToHost;
  const uint64_t chunk = staging_.chunk();
  std::vector<char*> slots = staging_.Acquire(2);
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
    status = CountedIo(e, start, slots[slot], std::min(chunk, bytes - start), false);
    if (!status.ok()) break;
    const uint64_t from = std::max(start, offset);
    const uint64_t to = std::min(start + chunk, offset + n);
    auto t = copy.Enqueue(dir, dst.addr + (from - offset), slots[slot] + (from - start), to - from,
                          dst.after);
    if (!t.ok()) {
      status = Retag(t.status(), TM_ERR_DEVICE);
      break;
    }
    in_flight[slot] = *t;
  }
  for (auto& t : in_flight) {  // never hand a slot back with a copy still reading it
    if (!t.has_value()) continue;
    absl::Status s = Retag(copy.Wait(*t), TM_ERR_DEVICE);
    if (status.ok()) status = s;
  }
  staging_.Release(slots);
  return status;
}

absl::Status Mover::WriteNvmeFrom(const Extent& old, const Extent& fresh, uint64_t bytes,
                                  uint64_t offset, const CallerBuffer& src, uint64_t n) {
  if (auto s = Retag(io::WaitAll(src.after), TM_ERR_DEVICE); !s.ok()) return s;
  const uint64_t chunk = staging_.chunk();
  std::vector<char*> slot = staging_.Acquire(1);
  absl::Status status;
  for (uint64_t start = 0; start < bytes && status.ok(); start += chunk) {
    const uint64_t len = std::min(chunk, bytes - start);
    const uint64_t from = std::max(start, offset);
    const uint64_t to = std::min(start + len, offset + n);
    const bool covered = from == start && to == start + len;  // all of it comes from src
    if (!covered) {
      if (old.empty()) {
        std::memset(slot[0], 0, len);
      } else if (!(status = CountedIo(old, start, slot[0], len, false)).ok()) {
        break;
      }
    }
    if (from < to) {
      if (src.device) {
        status =
            Retag(device_.copy_engine().Copy(CopyDirection::kDeviceToHost, slot[0] + (from - start),
                                             src.addr + (from - offset), to - from),
                  TM_ERR_DEVICE);
        if (!status.ok()) break;
      } else {
        std::memcpy(slot[0] + (from - start), src.addr + (from - offset), to - from);
      }
    }
    status = CountedIo(fresh, start, slot[0], len, true);
  }
  staging_.Release(slot);
  return status;
}

absl::Status Mover::CopyIn(tm_tier tier, char* addr, const void* src, uint64_t n,
                           const std::vector<io::FencePtr>& after) {
  if (auto s = Retag(io::WaitAll(after), TM_ERR_DEVICE); !s.ok()) return s;
  if (tier == TM_TIER_DRAM) {
    std::memcpy(addr, src, n);
    return absl::OkStatus();
  }
  // A caller's buffer is not a tier: these bytes are not counted as moved.
  return Retag(device_.copy_engine().Copy(CopyDirection::kHostToDevice, addr, src, n),
               TM_ERR_DEVICE);
}

absl::Status Mover::CopyOut(tm_tier tier, const char* addr, void* dst, uint64_t n,
                            const std::vector<io::FencePtr>& after) {
  if (auto s = Retag(io::WaitAll(after), TM_ERR_DEVICE); !s.ok()) return s;
  if (tier == TM_TIER_DRAM) {
    std::memcpy(dst, addr, n);
    return absl::OkStatus();
  }
  return Retag(device_.copy_engine().Copy(CopyDirection::kDeviceToHost, dst, addr, n),
               TM_ERR_DEVICE);
}

}  // namespace tiermem
