// The byte movers between host memory and swap files. An engine knows files and buffers only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"

namespace tiermem::io {

// One transfer between a host buffer and a file range.
struct IoRequest {
  int fd = -1;
  uint64_t offset = 0;   // in the file
  void* buffer = nullptr;
  uint64_t length = 0;
  bool write = false;
  uint32_t alignment = 1;       // O_DIRECT alignment of the file (1 when buffered)
  const char* label = "";       // names the file in error messages
};

struct IoEngineOptions {
  uint32_t block_size = 1u << 20;  // requests are cut into pieces of at most this size
  uint32_t queue_depth = 32;       // pieces in flight
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual absl::string_view name() const = 0;
  // Moves every request completely; returns when all are done. Short transfers are continued;
  // EAGAIN and EINTR are retried. The first hard error is returned (errno-derived code, the
  // file, offset and length in the message) after every piece in flight has completed.
  // Safe to call from several threads.
  virtual absl::Status Run(std::span<const IoRequest> requests) = 0;
};

// io_uring engine; Unavailable when the kernel or a sandbox refuses io_uring.
absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(const IoEngineOptions& options);
// pread/pwrite engine; always available.
std::unique_ptr<IoEngine> CreatePosixEngine(const IoEngineOptions& options);

// Shared by both engines: the error for a failed piece.
absl::Status IoError(const IoRequest& r, uint64_t done, uint64_t piece_length, int err);

}  // namespace tiermem::io
