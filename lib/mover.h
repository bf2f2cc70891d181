// Moving bytes between tiers, through engines (HBM <-> DRAM by the copy engine, DRAM <-> NVMe by
// the I/O engine, HBM <-> NVMe chunk by chunk through the staging pool, double-buffered). The
// mover knows no tensor: the runtime prepares a MovePlan under its lock (source, destination,
// extents, addresses), the mover executes it without the lock, and the runtime commits the
// outcome to the tensor's copy states. A plan's outcome is only OK when every completion was
// checked.
#pragma once

#include <array>
#include <atomic>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/device.h"
#include "io/io_engine.h"
#include "lib/staging_pool.h"
#include "lib/tiers.h"

namespace tiermem {

// Everything Execute needs, copied out of the tensor so that it runs without the lock.
struct MovePlan {
  int src = -1;  // a tier, or -1: the tensor was never written and the destination is zeroed
  tm_tier dst = TM_TIER_HBM;
  uint64_t bytes = 0;
  Extent src_extent, dst_extent;
  char* src_addr = nullptr;  // HBM or DRAM source
  char* dst_addr = nullptr;  // HBM or DRAM destination
  void* stream = nullptr;    // a caller's CUDA stream for a stream-ordered copy into HBM
  // Must pass before the source is read: its copy's uses, the caller's stream. A copy engine
  // waits for them on the device; other paths wait on the host first.
  std::vector<io::FencePtr> after;
};

// Where a caller's buffer is, for tm_tensor_copy_in / copy_out.
struct CallerBuffer {
  char* addr = nullptr;
  bool device = false;              // device memory (crosses the link)
  std::vector<io::FencePtr> after;  // the caller's stream fence and the copy's uses
};

class Mover {
 public:
  Mover(Tiers& tiers, io::Device& device, io::IoEngine& io, StagingPool& staging)
      : tiers_(tiers), device_(device), io_(io), staging_(staging) {}

  // With a plan's stream and a device that has streams, a copy into HBM from DRAM is only
  // enqueued: *pending receives its ticket, and the stream waits for it. Counts the bytes moved
  // when it succeeds.
  absl::Status Execute(const MovePlan& p, std::optional<io::CopyTicket>* pending);

  // Without the lock: host memory <-> an HBM or DRAM address, once `after` has passed.
  absl::Status CopyIn(tm_tier tier, char* addr, const void* src, uint64_t n,
                      const std::vector<io::FencePtr>& after = {});
  absl::Status CopyOut(tm_tier tier, const char* addr, void* dst, uint64_t n,
                       const std::vector<io::FencePtr>& after = {});
  // Without the lock: bytes [offset, offset+n) of a tensor of `bytes` held on NVMe at `e`,
  // into host memory, through one staging slot.
  absl::Status ReadNvme(const Extent& e, uint64_t bytes, uint64_t offset, void* dst, uint64_t n);
  // Without the lock: the same into a caller's buffer (host or device memory), pipelined: chunk
  // k+1 is read into one staging slot while chunk k is copied out of the other. Returns when
  // every copy is done (the slots go back to the pool).
  absl::Status ReadNvmeTo(const Extent& e, uint64_t bytes, uint64_t offset, const CallerBuffer& dst,
                          uint64_t n);
  // The direction of a copy between a tier's memory and a caller's buffer.
  static io::CopyDirection Direction(tm_tier tier, bool caller_device, bool into_tier);

  // Without the lock: makes `fresh` (an NVMe extent) hold the tensor's bytes with
  // [offset, offset+n) replaced by `src`; the rest comes from `old` (an NVMe extent), or is zero
  // when `old` is empty. Chunk by chunk through one staging slot. `old` is left untouched, so a
  // failure loses nothing.
  absl::Status WriteNvme(const Extent& old, const Extent& fresh, uint64_t bytes, uint64_t offset,
                         const void* src, uint64_t n);
  // The same from a caller's buffer (host or device memory).
  absl::Status WriteNvmeFrom(const Extent& old, const Extent& fresh, uint64_t bytes,
                             uint64_t offset, const CallerBuffer& src, uint64_t n);

  io::CopyEngine& copy_engine() { return device_.copy_engine(); }

  // Bytes moved between tiers, [from][to]; a staged HBM <-> NVMe move counts both hops, and a
  // caller copy to or from NVMe counts the bytes its staging slot wrote or read there.
  uint64_t moved(int from, int to) const { return moved_[from][to].load(); }

 private:
  absl::Status StagedUp(const Extent& src, char* dst, uint64_t bytes);
  absl::Status StagedDown(const char* src, const Extent& dst, uint64_t bytes);
  absl::Status ZeroNvme(const Extent& dst, uint64_t bytes);
  absl::Status Io(const Extent& e, uint64_t offset, char* buffer, uint64_t n, bool write);
  // Io that adds its bytes to moved_ when it succeeds: for the caller copies to and from NVMe.
  absl::Status CountedIo(const Extent& e, uint64_t offset, char* buffer, uint64_t n, bool write);

  absl::Status ExecuteUncounted(const MovePlan& p, std::optional<io::CopyTicket>* pending);
  void Count(const MovePlan& p);

  Tiers& tiers_;
  io::Device& device_;
  io::IoEngine& io_;
  StagingPool& staging_;
  std::array<std::array<std::atomic<uint64_t>, TM_TIER_COUNT>, TM_TIER_COUNT> moved_{};
};

}  // namespace tiermem
