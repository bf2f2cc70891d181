// tiermem-plan's output: the table for people and the --json object (docs/planner.md).
#pragma once

#include <string>

#include "lib/plan/planner.h"

namespace tiermem {

// Where each bandwidth came from ("--link-gbps", "probe copies ...", "" when not given).
struct PlanSources {
  std::string link, nvme, dram;
};

// Prints the plan; returns the exit status (0 with a recommendation, 1 when nothing fits).
int PrintPlanText(const PlanInput& in, const Plan& p, const PlanSources& src);
int PrintPlanJson(const PlanInput& in, const Plan& p, const PlanSources& src);

}  // namespace tiermem
