// DRAM <-> NVMe bandwidth of tiermem's I/O engines on raw swap files, as fio measures a drive:
// one buffer written to and read back from files in the given directories (striped over them in
// block-size units, as the NVMe tier stripes), at a given block size, queue depth and thread
// count. Used by tiermem-probe's sweep and by --tune.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/host_memory.h"
#include "io/swap_file.h"
#include "lib/config/config.h"

namespace tiermem {

struct IoPoint {
  uint32_t block_size = 0, queue_depth = 0, threads = 0;
  double write_gbps = 0, read_gbps = 0;  // 1e9 bytes/s, medians
  // Both directions together: bytes moved / time, the figure the tuner maximizes.
  double combined_gbps() const {
    return write_gbps > 0 && read_gbps > 0 ? 2 / (1 / write_gbps + 1 / read_gbps) : 0;
  }
  // The same settings (whatever was measured).
  bool SameSettings(const IoPoint& o) const {
    return block_size == o.block_size && queue_depth == o.queue_depth && threads == o.threads;
  }
};

class IoSweep {
 public:
  // Swap files of bytes / dirs.size() each in `dirs`, a source and a destination buffer of
  // `bytes` (2 MiB pages where the kernel gives them, like the DRAM tier).
  static absl::StatusOr<std::unique_ptr<IoSweep>> Create(const std::vector<std::string>& dirs,
                                                         uint64_t bytes, IoEngineKind engine);
  // Writes the buffer and reads it back, `repeats` times in turn; the data read last is compared
  // with what was written. InvalidArgument for a block size below the files' O_DIRECT
  // alignment or one that does not divide the bytes per file.
  absl::StatusOr<IoPoint> Measure(uint32_t block_size, uint32_t queue_depth, uint32_t threads,
                                  int repeats);
  // The engine the measurements ran on: "uring" or "posix".
  const std::string& engine() const { return engine_name_; }
  uint64_t bytes() const { return bytes_; }

 private:
  IoSweep() = default;
  std::vector<std::unique_ptr<io::SwapFile>> files_;
  std::unique_ptr<io::HostRegion> src_, dst_;
  uint64_t bytes_ = 0;
  IoEngineKind engine_kind_ = IoEngineKind::kAuto;
  std::string engine_name_;
};

}  // namespace tiermem
