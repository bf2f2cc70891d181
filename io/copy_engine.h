// The byte movers between host memory and device memory, and the fences that order them against
// callers' streams.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tiermem::io {

// A point in a queue of work (a caller's stream, or one copy of the engine): it passes once
// everything queued before it has finished. A CUDA event, or the emulated device's completion.
class Fence {
 public:
  virtual ~Fence() = default;
  // Blocks, without spinning a core, until the fence passes; the outcome of the work before it.
  virtual absl::Status Wait() = 0;
  // Whether it has passed (successfully or not); never blocks.
  virtual bool Passed() = 0;
};
using FencePtr = std::shared_ptr<Fence>;

// Where a copy's bytes are. Host memory may be pinned (full speed, truly async) or pageable
// (staged by the backend); device memory is the device's (a tier's, or a caller's).
enum class CopyDirection {
  kHostToDevice = 0,
  kDeviceToHost = 1,
  kDeviceToDevice = 2,
  kHostToHost = 3,
};

// One enqueued copy; its fence passes when the copy is done. Waited for by the host (Wait), by
// a caller's stream (StreamWait), or kept as a fence that later work must pass.
struct CopyTicket {
  FencePtr fence;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Enqueues a copy of `bytes` from src to dst and returns at once. The copy starts only after
  // every fence in `after` has passed (without blocking the host). On failure nothing of the
  // copy is left running.
  virtual absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src,
                                             uint64_t bytes,
                                             const std::vector<FencePtr>& after) = 0;
  absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src,
                                     uint64_t bytes) {
    return Enqueue(dir, dst, src, bytes, {});
  }
  // Blocks until the copy is done; returns its outcome.
  absl::Status Wait(const CopyTicket& ticket) {
    if (ticket.fence == nullptr) return absl::InvalidArgumentError("an empty copy ticket");
    return ticket.fence->Wait();
  }

  // A fence recorded on a caller's stream (a cudaStream_t, or an emulated stream): it passes
  // when the work queued on the stream so far has finished. InvalidArgument for a stream that
  // is not a live stream of this device; Unimplemented for one being captured into a graph
  // (the fence would be recorded once, at capture, not at each replay).
  virtual absl::StatusOr<FencePtr> RecordOnStream(void* stream) = 0;
  // Makes the caller's stream wait for the fence without blocking the host. The same errors as
  // RecordOnStream.
  virtual absl::Status StreamWait(void* stream, const FencePtr& fence) = 0;

  // Enqueue, then Wait.
  absl::Status Copy(CopyDirection dir, void* dst, const void* src, uint64_t bytes) {
    auto t = Enqueue(dir, dst, src, bytes);
    if (!t.ok()) return t.status();
    return Wait(*t);
  }
};

// Waits for every fence; the first failure.
inline absl::Status WaitAll(const std::vector<FencePtr>& fences) {
  absl::Status first;
  for (const FencePtr& f : fences) {
    absl::Status s = f->Wait();
    if (first.ok()) first = s;
  }
  return first;
}

}  // namespace tiermem::io
