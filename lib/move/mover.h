// Moving bytes between tiers, through engines (HBM <-> DRAM by the copy engine, DRAM <-> NVMe by
// the I/O engine, HBM <-> NVMe chunk by chunk through the staging ring, double-buffered). The
// mover knows no tensor: the runtime prepares a MovePlan under its lock (source, destination,
// extents, addresses), the mover executes it without the lock, and the runtime commits the
// outcome to the tensor's copy states. A plan's outcome is only OK when every completion was
// checked.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/device.h"
#include "io/io_engine.h"
#include "lib/move/staging_ring.h"
#include "lib/tiers/tiers.h"

namespace tiermem {

// A fence over part of a destination: bytes [offset, offset + size) of it must not be written
// before `fence` passes (a copy down still reading the memory there: Runtime::Vacate).
struct RangeFence {
  uint64_t offset = 0;
  uint64_t size = 0;
  io::FencePtr fence;
};

// Everything Execute needs, copied out of the tensor so that it runs without the lock.
struct MovePlan {
  int src = -1;  // a tier, or -1: the tensor was never written and the destination is zeroed
  tm_tier dst = TM_TIER_HBM;
  uint64_t bytes = 0;
  Extent src_extent, dst_extent;
  char* src_addr = nullptr;  // HBM or DRAM source
  char* dst_addr = nullptr;  // HBM or DRAM destination
  void* stream = nullptr;    // a caller's CUDA stream for a stream-ordered copy into HBM
  // Into HBM from DRAM without a stream: only enqueued, its ticket in *pending for the runtime
  // to land (a scheduled prefetch started on the caller's thread: Moves::StartPrefetch).
  bool enqueue_only = false;
  // Must pass before the source is read: its copy's uses, the caller's stream. A copy engine
  // waits for them on the device; other paths wait on the host first.
  std::vector<io::FencePtr> after;
  // Called with the copy's fence once a copy engine has the copy (DRAM <-> HBM only), before
  // the host waits for it: the runtime orders the next prefetch after it (LinkOrder).
  std::function<void(const io::FencePtr&)> on_enqueued;
  // HBM -> DRAM by the copy engine: the copy goes down in pieces, each after the one before,
  // and once all are enqueued on_vacate gets their fences (offsets from the source's start),
  // so that the runtime can hand the source's memory on while they run (Runtime::Vacate).
  // It returns whether it handed the memory on; when it did not, Execute waits for the pieces
  // whatever `lands` says.
  std::function<bool(std::vector<RangeFence>)> on_vacate;
  // With on_vacate: once the memory is handed on, Execute returns without waiting, the last
  // piece's ticket in *pending (each piece follows the one before): the destination lands (an
  // eviction's write-down, so that the move it makes room for can follow it at once).
  bool lands = false;
  // Parts of the destination that a copy down is still vacating (offsets from its start). Into
  // HBM from DRAM without a caller's stream, the copy goes up in pieces, each after the fences
  // over its bytes, so that it follows the copy down piece by piece; every other path waits
  // for all of them first.
  std::vector<RangeFence> behind;
  // Pieces of those two piecewise copies.
  static constexpr uint64_t kPiece = uint64_t{2} << 20;
};

// Where a caller's buffer is, for tm_tensor_copy_in / copy_out.
// The NVMe bytes one caller copy read and wrote (a partial write reads the chunks it covers only
// in part): what moved() gained from it, for the trace.
struct NvmeTally {
  uint64_t read = 0;
  uint64_t written = 0;
};

struct CallerBuffer {
  char* addr = nullptr;
  bool device = false;              // device memory (crosses the link)
  std::vector<io::FencePtr> after;  // the caller's stream fence and the copy's uses
};

class Mover {
 public:
  Mover(Tiers& tiers, io::Device& device, io::IoEngine& io, StagingRing& staging)
      : tiers_(tiers), device_(device), io_(io), staging_(staging) {}

  // With a plan's stream and a device that has streams, a copy into HBM from DRAM is only
  // enqueued: *pending receives its ticket, and the stream waits for it (with enqueue_only,
  // nothing waits: the runtime lands the ticket). Counts the bytes moved
  // when it succeeds.
  absl::Status Execute(const MovePlan& p, std::optional<io::CopyTicket>* pending);

  // Without the lock: bytes [offset, offset+n) of a tensor of `bytes` held on NVMe at `e`, into
  // a caller's buffer (host or device memory), pipelined through two staging slots. Returns
  // when every copy is done.
  absl::Status ReadNvmeTo(const Extent& e, uint64_t bytes, uint64_t offset, const CallerBuffer& dst,
                          uint64_t n, NvmeTally* tally);
  // Without the lock: makes `fresh` (an NVMe extent) hold the tensor's bytes with
  // [offset, offset+n) replaced from a caller's buffer (host or device memory); the rest comes
  // from `old` (an NVMe extent), or is zero when `old` is empty. Pipelined through two staging
  // slots. `old` is left untouched, so a failure loses nothing.
  absl::Status WriteNvmeFrom(const Extent& old, const Extent& fresh, uint64_t bytes,
                             uint64_t offset, const CallerBuffer& src, uint64_t n,
                             NvmeTally* tally);
  // The direction of a copy between a tier's memory and a caller's buffer.
  static io::CopyDirection Direction(tm_tier tier, bool caller_device, bool into_tier);

  io::CopyEngine& copy_engine() { return device_.copy_engine(); }

  // Bytes moved between tiers, [from][to]; a staged HBM <-> NVMe move counts both hops, and a
  // caller copy to or from NVMe counts the bytes its staging slot wrote or read there.
  uint64_t moved(int from, int to) const { return moved_[from][to].load(); }

 private:
  // The two staged loops every NVMe path goes through (see ReadNvmeTo and WriteNvmeFrom). With
  // a `tally`, the NVMe legs add to moved_ and to it (a caller copy; a MovePlan is counted by
  // Count).
  absl::Status StagedRead(const Extent& e, uint64_t bytes, uint64_t offset, const CallerBuffer& dst,
                          uint64_t n, NvmeTally* tally);
  absl::Status StagedWrite(const Extent& old, const Extent& fresh, uint64_t bytes, uint64_t offset,
                           const CallerBuffer& src, uint64_t n, NvmeTally* tally);
  absl::Status Io(const Extent& e, uint64_t offset, char* buffer, uint64_t n, bool write);
  // Io that adds its bytes to moved_ when it succeeds: for the caller copies to and from NVMe.
  absl::Status CountedIo(const Extent& e, uint64_t offset, char* buffer, uint64_t n, bool write,
                         NvmeTally* tally);

  absl::Status ExecuteUncounted(const MovePlan& plan, std::optional<io::CopyTicket>* pending);
  // The two piecewise plans (a move up behind copies down, a copy down handing its memory on);
  // nullopt for any other.
  std::optional<absl::Status> ExecutePieces(const MovePlan& plan,
                                            std::optional<io::CopyTicket>* pending);
  // A copy by the engine in pieces of MovePlan::kPiece, each after the one before; the first
  // after `after`, each after the fences of `behind` over its bytes. On failure what was
  // enqueued has drained.
  absl::Status EnqueuePieces(io::CopyDirection dir, char* dst, const char* src, uint64_t bytes,
                             const std::vector<io::FencePtr>& after,
                             const std::vector<RangeFence>& behind,
                             std::vector<io::CopyTicket>* pieces);
  // Waits for every piece; the first failure.
  absl::Status WaitPieces(const std::vector<io::CopyTicket>& pieces);
  void Count(const MovePlan& p);

  Tiers& tiers_;
  io::Device& device_;
  io::IoEngine& io_;
  StagingRing& staging_;
  std::array<std::array<std::atomic<uint64_t>, TM_TIER_COUNT>, TM_TIER_COUNT> moved_{};
};

}  // namespace tiermem
