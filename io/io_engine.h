// The byte movers between host memory and swap files. An engine knows files and buffers only.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tiermem::io {

// One transfer between a host buffer and a file range.
struct IoRequest {
  int fd = -1;
  uint64_t offset = 0;  // in the file
  void* buffer = nullptr;
  uint64_t length = 0;
  bool write = false;
  uint32_t alignment = 1;  // O_DIRECT alignment of the file (1 when buffered)
  const char* label = "";  // names the file in error messages
};

struct IoEngineOptions {
  uint32_t block_size = 1u << 20;  // requests are cut into pieces of at most this size
  uint32_t queue_depth = 32;       // pieces in flight per I/O thread
  uint32_t threads = 1;            // I/O threads (io_uring: one ring each)
  // Host memory that most I/O uses (the pinned DRAM pool): registered as fixed buffers.
  std::vector<iovec> buffers;
  // Files that all I/O goes to (the swap files): registered.
  std::vector<int> files;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual absl::string_view name() const = 0;
  // Moves every request completely; returns when all are done. Pieces of all concurrent calls
  // share the engine's threads. Short transfers are continued from an aligned offset; EAGAIN
  // and EINTR are retried. The first hard error is returned (errno-derived code, the file,
  // offset and length in the message) once every piece in flight has completed; pieces not yet
  // started are dropped. Safe to call from several threads.
  virtual absl::Status Run(std::span<const IoRequest> requests) = 0;
  // Whether buffers and files were registered (false where the kernel or RLIMIT_MEMLOCK refused,
  // or nothing was given).
  virtual bool buffers_registered() const { return false; }
  virtual bool files_registered() const { return false; }
};

// io_uring engine; Unavailable when the kernel or a sandbox refuses io_uring.
absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(const IoEngineOptions& options);
// pread/pwrite engine on queue_depth x threads worker threads; always available.
std::unique_ptr<IoEngine> CreatePosixEngine(const IoEngineOptions& options);

}  // namespace tiermem::io
