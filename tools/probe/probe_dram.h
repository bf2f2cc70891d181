// tiermem-probe's host memory row: a STREAM-like triad, the bandwidth that bounds the CPU
// optimizer step once the optimizer state lives in DRAM (tiermem-plan --dram-gbps).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tiermem {

struct DramMeasurement {
  uint64_t bytes = 0;  // per array; three arrays
  int threads = 0;
  int repeats = 0;
  double gbps = 0;  // 1e9 bytes per second, best of `repeats`, 24 B counted per element
};

// a[i] = b[i] + q * c[i] over three arrays of `bytes` each (fp64), split over one thread per
// core, each thread touching its own slice first (so its pages are local to it). Counted as
// STREAM counts: two reads and one write per element, 24 B. One untimed pass, then the best of
// `repeats` timed passes; the result is checked. ResourceExhausted when the arrays cannot be had.
absl::StatusOr<DramMeasurement> DramTriad(uint64_t bytes, int repeats);

// The probe's table row ("dram        triad ...\n") and its JSON member ("dram": {...}, the
// schema in docs/probe.md).
std::string DramRow(const DramMeasurement& m);
std::string DramJson(const DramMeasurement& m);

}  // namespace tiermem
