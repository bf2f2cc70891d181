// The move paths between tiers.
#include "lib/mover.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "lib/status.h"

namespace tiermem {

TierSpace& Mover::space(tm_tier tier) {
  switch (tier) {
    case TM_TIER_HBM: return hbm_.space();
    case TM_TIER_DRAM: return dram_.space();
    default: return nvme_.space();
  }
}

char* Mover::Address(Tensor& t, tm_tier tier) {
  MemoryTier& m = tier == TM_TIER_HBM ? hbm_ : dram_;
  return m.Address(t.copy(tier).extent);
}

absl::Status Mover::Reserve(Tensor& t, tm_tier dst) {
  TensorCopy& c = t.copy(dst);
  if (c.valid) return absl::OkStatus();
  if (c.extent.empty()) {
    auto e = space(dst).Allocate(t.bytes, t.name);
    if (!e.ok()) return e.status();
    c.extent = *e;
  }
  c.valid = true;
  return absl::OkStatus();
}

void Mover::Drop(Tensor& t, tm_tier tier) {
  TensorCopy& c = t.copy(tier);
  space(tier).Free(c.extent);
  c.valid = false;
}

absl::Status Mover::ViaDram(Tensor& t, tm_tier dst) {
  const bool had_dram = t.copy(TM_TIER_DRAM).valid;
  if (auto s = MakeValid(t, TM_TIER_DRAM); !s.ok()) {
    return WithContext(s, absl::StrFormat("staging tensor \"%s\" in DRAM", t.name));
  }
  absl::Status s = MakeValid(t, dst);
  if (!had_dram) Drop(t, TM_TIER_DRAM);
  return s;
}

absl::Status Mover::MakeValid(Tensor& t, tm_tier dst) {
  if (t.copy(dst).valid) return absl::OkStatus();
  if (!t.materialized()) {
    // Zeros are made where they can be written directly, then moved like any data.
    if (dst == TM_TIER_NVME) return ViaDram(t, dst);
    auto e = space(dst).Allocate(t.bytes, t.name);
    if (!e.ok()) return e.status();
    t.copy(dst).extent = *e;
    char* p = Address(t, dst);
    absl::Status s;
    if (dst == TM_TIER_HBM) {
      s = Retag(device_.Fill(p, 0, e->size), TM_ERR_DEVICE);
    } else {
      std::memset(p, 0, e->size);
    }
    if (!s.ok()) {
      Drop(t, dst);
      return s;
    }
    t.copy(dst).valid = true;
    return absl::OkStatus();
  }
  // The nearest valid copy; on a tie, the faster tier.
  int src = -1;
  for (int d = 1; d < TM_TIER_COUNT && src < 0; ++d) {
    for (int cand : {static_cast<int>(dst) - d, static_cast<int>(dst) + d}) {
      if (cand >= 0 && cand < TM_TIER_COUNT && t.copies[cand].valid) {
        src = cand;
        break;
      }
    }
  }
  if (std::abs(src - static_cast<int>(dst)) > 1) return ViaDram(t, dst);
  auto e = space(dst).Allocate(t.bytes, t.name);
  if (!e.ok()) return e.status();
  t.copy(dst).extent = *e;
  if (auto s = Transfer(t, static_cast<tm_tier>(src), dst); !s.ok()) {
    Drop(t, dst);
    return WithContext(s, absl::StrFormat("moving tensor \"%s\" (%s) from %s to %s", t.name,
                                          HumanBytes(t.bytes), tm_tier_name(static_cast<tm_tier>(src)),
                                          tm_tier_name(dst)));
  }
  t.copy(dst).valid = true;
  moved_[src][dst] += t.bytes;
  return absl::OkStatus();
}

absl::Status Mover::Transfer(Tensor& t, tm_tier src, tm_tier dst) {
  if (src == TM_TIER_NVME || dst == TM_TIER_NVME) {
    const bool write = dst == TM_TIER_NVME;
    const Extent& file_extent = t.copy(TM_TIER_NVME).extent;
    auto requests = nvme_.Requests(file_extent, Address(t, TM_TIER_DRAM), t.bytes, write);
    return Retag(io_.Run(requests), TM_ERR_IO);
  }
  const bool up = dst == TM_TIER_HBM;
  return Retag(device_.copy_engine().Copy(
                   up ? io::CopyDirection::kHostToDevice : io::CopyDirection::kDeviceToHost,
                   Address(t, dst), Address(t, src), t.bytes),
               TM_ERR_DEVICE);
}

absl::Status Mover::CopyIn(Tensor& t, tm_tier tier, uint64_t offset, const void* src, uint64_t n) {
  char* p = Address(t, tier) + offset;
  if (tier == TM_TIER_DRAM) {
    std::memcpy(p, src, n);
    return absl::OkStatus();
  }
  // A caller's buffer is not a tier: these bytes are not counted as moved.
  return Retag(device_.copy_engine().Copy(io::CopyDirection::kHostToDevice, p, src, n),
               TM_ERR_DEVICE);
}

absl::Status Mover::CopyOut(Tensor& t, tm_tier tier, uint64_t offset, void* dst, uint64_t n) {
  const char* p = Address(t, tier) + offset;
  if (tier == TM_TIER_DRAM) {
    std::memcpy(dst, p, n);
    return absl::OkStatus();
  }
  return Retag(device_.copy_engine().Copy(io::CopyDirection::kDeviceToHost, dst, p, n),
               TM_ERR_DEVICE);
}

}  // namespace tiermem
