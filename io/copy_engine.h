// The byte movers between host memory and device memory (DRAM <-> HBM).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tiermem::io {

enum class CopyDirection { kHostToDevice = 0, kDeviceToHost = 1 };

// Identifies one enqueued copy until it is waited for.
struct CopyTicket {
  uint64_t id = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Enqueues a copy of `bytes` from src to dst and returns at once. Host memory may be pinned
  // (full speed, truly async) or pageable (staged by the backend).
  virtual absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src,
                                             uint64_t bytes) = 0;
  // Blocks until the copy is done; returns its outcome. Each ticket is waited for once.
  virtual absl::Status Wait(CopyTicket ticket) = 0;
  // Makes `stream` (a cudaStream_t) wait for the copy without blocking the host. The ticket must
  // still be waited for. Unimplemented where there are no streams (the emulated device).
  virtual absl::Status StreamWait(void* stream, CopyTicket ticket) {
    (void)stream, (void)ticket;
    return absl::UnimplementedError("this device has no streams");
  }

  // Enqueue, then Wait.
  absl::Status Copy(CopyDirection dir, void* dst, const void* src, uint64_t bytes) {
    auto t = Enqueue(dir, dst, src, bytes);
    if (!t.ok()) return t.status();
    return Wait(*t);
  }
};

}  // namespace tiermem::io
