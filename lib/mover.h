// Moves: a tensor's copy made valid in a tier from the nearest valid copy, through engines
// (HBM <-> DRAM by the copy engine, DRAM <-> NVMe by the I/O engine, HBM <-> NVMe staged in
// DRAM). Transactional: the destination becomes valid only after every completion was checked,
// and a failure frees the destination and leaves every valid copy as it was.
#pragma once

#include <array>
#include <atomic>

#include "absl/status/status.h"
#include "io/device.h"
#include "io/io_engine.h"
#include "lib/memory_tier.h"
#include "lib/nvme_tier.h"
#include "lib/tensor.h"

namespace tiermem {

class Mover {
 public:
  Mover(MemoryTier& hbm, MemoryTier& dram, NvmeTier& nvme, io::Device& device,
        io::IoEngine& io)
      : hbm_(hbm), dram_(dram), nvme_(nvme), device_(device), io_(io) {}

  // Makes t's copy in `dst` valid. A tensor never written becomes zeros.
  absl::Status MakeValid(Tensor& t, tm_tier dst);
  // Reserves t's copy in `dst` and declares it valid without filling it: for callers that
  // overwrite the whole tensor next.
  absl::Status Reserve(Tensor& t, tm_tier dst);
  // Frees t's copy in `tier` (valid or not). The caller checks pins.
  void Drop(Tensor& t, tm_tier tier);

  // Host memory <-> t's valid copy in `tier` (HBM or DRAM), at byte `offset`.
  absl::Status CopyIn(Tensor& t, tm_tier tier, uint64_t offset, const void* src, uint64_t n);
  absl::Status CopyOut(Tensor& t, tm_tier tier, uint64_t offset, void* dst, uint64_t n);

  // Address of t's copy in an addressable tier.
  char* Address(Tensor& t, tm_tier tier);
  TierSpace& space(tm_tier tier);

  // Bytes moved between tiers, [from][to].
  uint64_t moved(int from, int to) const { return moved_[from][to].load(); }

 private:
  absl::Status Transfer(Tensor& t, tm_tier src, tm_tier dst);
  absl::Status ViaDram(Tensor& t, tm_tier dst);

  MemoryTier& hbm_;
  MemoryTier& dram_;
  NvmeTier& nvme_;
  io::Device& device_;
  io::IoEngine& io_;
  std::array<std::array<std::atomic<uint64_t>, TM_TIER_COUNT>, TM_TIER_COUNT> moved_{};
};

}  // namespace tiermem
