// tiermem-probe's report: what it found, as a table for humans or as JSON (docs/probe.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lib/runtime/runtime.h"
#include "tools/probe/io_sweep.h"
#include "tools/probe/probe_dram.h"
#include "tools/probe/probe_measure.h"
#include "tools/probe/tune.h"

namespace tiermem {

// Everything one run of tiermem-probe measured (each part absent when skipped).
struct Findings {
  std::vector<Measurement> bw;
  std::vector<CopyMeasurement> copies;
  std::optional<DramMeasurement> dram;
  std::vector<SweepTarget> sweep;
  std::optional<DemoResult> demo;
  std::optional<TuneResult> tune;
  std::string tune_file;
  double seconds = 0;
};

void PrintHuman(Runtime& rt, const Findings& f);
void PrintJson(Runtime& rt, const Findings& f);

}  // namespace tiermem
