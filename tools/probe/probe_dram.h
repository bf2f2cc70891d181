// tiermem-probe's host memory rows: a STREAM-like triad, and the CPU Adam step itself, whose
// bandwidth prices the CPU optimizer step once the optimizer state lives in DRAM (tiermem-plan
// --probe; --dram-gbps by hand).
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
  // The CPU Adam step (tiermem's kernel, fp32 gradients) over `adam_params` parameters past the
  // caches, on `threads` threads: 28 B per parameter over the best of `repeats` steps. 0 when it
  // was not measured.
  uint64_t adam_params = 0;
  double adam_gbps = 0;
  std::string adam_isa;
};

// a[i] = b[i] + q * c[i] over three arrays of `bytes` each (fp64), split over one thread per
// core, each thread touching its own slice first (so its pages are local to it). Counted as
// STREAM counts: two reads and one write per element, 24 B. One untimed pass, then the best of
// `repeats` timed passes; the result is checked. ResourceExhausted when the arrays cannot be had.
absl::StatusOr<DramMeasurement> DramTriad(uint64_t bytes, int repeats);

// Adds the CPU Adam step's figures to `m`: parameter, m, v and gradient arrays (fp32) of
// `bytes` / 4 elements each, stepped by the kernel tiermem's CPUAdam runs (the best instruction
// set of this CPU) on m.threads threads, one untimed step, then the best of m.repeats. A fused
// step moves 28 B per parameter (reads p, m, v, g; writes p, m, v to lines it has read), so
// unlike the triad it pays no write-allocate: on the development VM it ran at 1.6-1.8x the
// triad's STREAM-counted figure, and the planner priced the step that much too slow.
absl::Status DramAdam(uint64_t bytes, DramMeasurement& m);

// The probe's table row ("dram        triad ...\n") and its JSON member ("dram": {...}, the
// schema in docs/probe.md).
std::string DramRow(const DramMeasurement& m);
std::string DramJson(const DramMeasurement& m);

}  // namespace tiermem
