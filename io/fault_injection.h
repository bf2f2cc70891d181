// Test-only fault injection for the I/O engines: a test installs an injector that may rewrite
// the result of any completion (EIO, ENOSPC, EAGAIN, a short count) or refuse io_uring set-up.
// Production code never installs one; the cost when none is installed is one atomic load.
#pragma once

#include <cstdint>

#include "io/io_engine.h"

namespace tiermem::io {

class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  // `result` is what the kernel returned for a piece (bytes moved or -errno) of `request`
  // starting at `file_offset`; the engine acts on the returned value instead.
  virtual int OnCompletion(const IoRequest& request, uint64_t file_offset, uint64_t length,
                           int result) {
    (void)request, (void)file_offset, (void)length;
    return result;
  }
  // True to make io_uring set-up fail as in a sandbox that forbids it.
  virtual bool FailUringSetup() { return false; }
};

// Installs `f` (not owned; nullptr removes). Not for use while I/O is running.
void SetFaultInjector(FaultInjector* f);
FaultInjector* CurrentFaultInjector();

}  // namespace tiermem::io
