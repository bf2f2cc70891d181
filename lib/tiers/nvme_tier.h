// The NVMe tier: one swap file per TIERMEM_NVME_PATHS directory, a tensor's extent striped
// round-robin over them at block granularity (RAID-0 in software), with per-block checksums of
// what was written when TIERMEM_CHECKSUM asks for them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "lib/tiers/checksum.h"
#include "lib/tiers/tier_space.h"

namespace tiermem {

// How NvmeTier's messages name its settings.
struct NvmeSettingNames {
  std::string budget = "TIERMEM_NVME_BYTES";
  std::string paths = "TIERMEM_NVME_PATHS";
  std::string stripe = "TIERMEM_IO_BLOCK_SIZE";
};

class NvmeTier {
 public:
  // `bytes` is the budget over all paths; `stripe` (a power of two >= 4 KiB) the unit placed on
  // one file before moving to the next. TM_ERR_NO_SPACE when a file system cannot reserve its
  // share, TM_ERR_CONFIG for a bad directory. `names` name the settings in messages: where they
  // were set (Config::SettingName).
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Create(const std::vector<std::string>& paths,
                                                          uint64_t bytes, uint32_t stripe,
                                                          const NvmeSettingNames& names = {});

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

  // From now on, every extent written carries an XXH3-64 per `block` bytes (a power of two
  // that divides every write's offset in its extent), checked by every read. Call before use.
  void EnableChecksums(uint64_t block);
  // The sums, or nullptr when checksums are off.
  const BlockChecksums* checksums() const { return checksums_.get(); }

  // Moves `length` bytes between `buffer` and bytes [offset, ...) of the extent through
  // `engine` (see Requests). I/O errors are TM_ERR_IO (TM_ERR_NO_SPACE: the disk is full).
  // With checksums, a completed write records the sums of the blocks it wrote, and a completed
  // read is checked against them: a block that differs is TM_ERR_CORRUPT naming the swap file
  // and offset, and a block the read covers only in part is read whole, checked, and served
  // from that whole read. After a failed read the buffer holds nothing to use.
  absl::Status Transfer(io::IoEngine& engine, const Extent& e, uint64_t offset, char* buffer,
                        uint64_t length, bool write) const;

 private:
  NvmeTier() = default;
  // Where logical byte `logical` of the tier lives: its file and the offset in that file, and
  // how many bytes from there stay in that file (to the end of the stripe).
  struct Place {
    const io::SwapFile* file;
    uint64_t offset;
    uint64_t run;
  };
  Place Locate(uint64_t logical) const;
  // The transfer itself, without checksums.
  absl::Status Run(io::IoEngine& engine, const Extent& e, uint64_t offset, char* buffer,
                   uint64_t length, bool write) const;
  // The files and file offsets of bytes [offset, offset + length) of `e`, for messages.
  std::string Describe(const Extent& e, uint64_t offset, uint64_t length) const;
  absl::Status VerifyRead(io::IoEngine& engine, const Extent& e, uint64_t offset, char* buffer,
                          uint64_t length) const;
  std::unique_ptr<BlockChecksums> checksums_;
  std::vector<std::unique_ptr<io::SwapFile>> files_;
  std::unique_ptr<TierSpace> space_;
  uint32_t stripe_ = 0;
  uint32_t alignment_ = 4096;
};

}  // namespace tiermem
