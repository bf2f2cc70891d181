// The bandwidths tiermem-plan needs, read from tiermem-probe --json output (docs/probe.md).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tiermem {

struct ProbeBandwidths {
  double link_bytes_per_s = 0;  // HBM <-> DRAM, the slower direction; 0 when the probe has none
  std::string link_source;      // which measurement it came from
  double nvme_bytes_per_s = 0;  // DRAM <-> NVMe, the slower direction; 0 when none
  std::string nvme_source;
  double dram_bytes_per_s = 0;  // the CPU Adam step's, else the triad's; 0 when the probe has none
  std::string dram_source;      // (probes before the triad row have none)
  bool gpu = false;             // false: the HBM figures are the emulated device's (host memory)
  std::string device;
};

// HBM <-> DRAM: the pinned copies (device-clock timed), else the runtime path. DRAM <-> NVMe:
// the runtime path at the configured block size and depth, else the sweep's best over all paths.
// DRAM: the triad row (`dram.triad_gbps`), absent from older probe files.
// InvalidArgument when the text is not JSON or not tiermem-probe/1 output.
absl::StatusOr<ProbeBandwidths> ReadProbeJson(absl::string_view text);

}  // namespace tiermem
