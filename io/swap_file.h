// A swap file: anonymous (no name survives exit or a crash), mode 0600, O_DIRECT when the file
// system allows it, with its alignment probed and its space reserved up front.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tiermem::io {

class SwapFile {
 public:
  // Creates a file of `bytes` in directory `dir`. ResourceExhausted when the file system cannot
  // reserve the space (whatever errno it gave); InvalidArgument for more than 2^63 - 1 bytes;
  // NotFound / FailedPrecondition for a bad directory.
  static absl::StatusOr<std::unique_ptr<SwapFile>> Create(const std::string& dir, uint64_t bytes);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  const std::string& dir() const { return dir_; }
  uint64_t size() const { return size_; }
  // Whether I/O bypasses the page cache; false when the file system refused O_DIRECT.
  bool direct() const { return direct_; }
  // Alignment of buffer addresses, offsets and lengths for I/O on this file (1 when buffered).
  uint32_t alignment() const { return alignment_; }
  // Where the alignment came from: "statx", "block device", "default" or "buffered".
  const std::string& alignment_source() const { return alignment_source_; }
  // Whether its blocks were reserved up front (fallocate); false where the file system does not
  // support it and the file was only sized (its blocks are allocated as it is written).
  bool reserved() const { return reserved_; }

 private:
  SwapFile() = default;
  int fd_ = -1;
  std::string dir_;
  uint64_t size_ = 0;
  bool direct_ = false;
  uint32_t alignment_ = 1;
  std::string alignment_source_;
  bool reserved_ = true;
};

// O_DIRECT alignment of an open file: statx(STATX_DIOALIGN), then the block device's logical
// block size, then 4096. `source` says which one answered.
uint32_t ProbeDirectIoAlignment(int fd, std::string* source);

}  // namespace tiermem::io
