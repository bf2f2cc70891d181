// The NVMe tier: one swap file per TIERMEM_NVME_PATHS directory, a tensor's extent striped
// round-robin over them at block granularity (RAID-0 in software).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "lib/tier_space.h"

namespace tiermem {

class NvmeTier {
 public:
  // `bytes` is the budget over all paths; `stripe` (a power of two >= 4 KiB) the unit placed on
  // one file before moving to the next. TM_ERR_NO_SPACE when a file system cannot reserve its
  // share, TM_ERR_CONFIG for a bad directory.
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Create(const std::vector<std::string>& paths,
                                                          uint64_t bytes, uint32_t stripe);

  TierSpace& space() { return *space_; }
  const TierSpace& space() const { return *space_; }
  const std::vector<std::unique_ptr<io::SwapFile>>& files() const { return files_; }
  // Largest O_DIRECT alignment over the files; host buffers and lengths must honour it.
  uint32_t alignment() const { return alignment_; }

  // The I/O requests that move `length` bytes between `buffer` and the extent, from byte
  // `offset` of the extent (a multiple of the alignment). `length` is rounded up to the
  // alignment (the buffer must have room for that).
  std::vector<io::IoRequest> Requests(const Extent& e, uint64_t offset, void* buffer,
                                      uint64_t length, bool write) const;

 private:
  NvmeTier() = default;
  std::vector<std::unique_ptr<io::SwapFile>> files_;
  std::unique_ptr<TierSpace> space_;
  uint32_t stripe_ = 0;
  uint32_t alignment_ = 4096;
};

}  // namespace tiermem
