// Integrity of the NVMe tier (TIERMEM_CHECKSUM=xxh3): an XXH3-64 of every block of every extent
// written, kept in memory, so that bytes read back can be checked against what was written.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/sync.h"

namespace tiermem {

// Block k of an extent is its bytes [k * block, (k + 1) * block), the last one cut where the
// write that covered it ended (the tensor's end). Sums are keyed by the extent's offset in the
// tier: the tier forgets an extent's sums before the extent's space can be handed out again.
class BlockChecksums {
 public:
  // `block`: bytes per sum, a power of two; every write starts at a multiple of it.
  explicit BlockChecksums(uint64_t block) : block_(block) {}

  uint64_t block() const { return block_; }

  // After a write of `data` to bytes [offset, offset + n) of the extent at `extent` completed:
  // records the sums of the blocks it covered (a last partial block with its length).
  // TM_ERR_INTERNAL when `offset` is not a multiple of block(): the sum of a block written in
  // part would need the rest of the block.
  absl::Status Record(uint64_t extent, uint64_t offset, const char* data, uint64_t n);

  // Record in two halves, so that the hashing can run while the write does: the sums of
  // `data`, to be stored once the write is known good.
  struct Sum {
    uint64_t hash = 0;
    uint64_t length = 0;  // 0: nothing recorded
  };
  absl::StatusOr<std::vector<Sum>> Hash(uint64_t offset, const char* data, uint64_t n) const;
  void Store(uint64_t extent, uint64_t offset, const std::vector<Sum>& sums);

  // What a read of [offset, offset + n) of an extent, landed in `data`, proved.
  struct Check {
    // A block wholly inside the read whose bytes differ from its sum (the first one).
    struct Mismatch {
      uint64_t offset = 0;  // of the block, in the extent
      uint64_t length = 0;
      uint64_t expected = 0, actual = 0;
    };
    std::optional<Mismatch> mismatch;
    // Blocks the read covers only in part: they can only be checked when read whole.
    std::vector<uint64_t> partial;  // block offsets in the extent
    // A block in the read with no recorded sum (never written: a bug), its offset.
    std::optional<uint64_t> unrecorded;
  };
  Check Verify(uint64_t extent, uint64_t offset, const char* data, uint64_t n) const;

  // Length of the recorded block at `block_offset` (0 when none).
  uint64_t BlockLength(uint64_t extent, uint64_t block_offset) const;

  // Drops the sums of the extent at `extent` (freed).
  void Forget(uint64_t extent);

  // Extents with sums, for tests.
  size_t extents() const;

 private:
  const uint64_t block_;
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, std::vector<Sum>> sums_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tiermem
