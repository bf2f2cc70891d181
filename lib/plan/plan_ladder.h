// The ladder's combinations: which sets of rungs make sense together, what each set needs in HBM
// and adds to a step (recompute, transfers beyond compute, the CPU optimizer step beyond
// backward), and which one to recommend. MakePlan (lib/planner.h) calls PriceLadder once the
// per-layer figures are known.
#pragma once

#include <string>

#include "lib/plan/planner.h"

namespace tiermem {

// A set is valid when per-layer recompute comes with selective recompute (the recomputed
// layer's backward keeps only its selective activations), activations go to at most one of
// DRAM and NVMe, and parameter offload comes with optimizer-state offload (the fp32 state is
// in DRAM, where the CPU steps it).
bool ValidRungSet(RungSet set);

// The price of one valid set, from the figures MakePlan computed into `figures`.
PlanPrice PriceRungSet(const PlanInput& in, const Plan& figures, RungSet set);

// Prices every valid set into p->combinations, the cumulative ladder into p->rungs, and
// recommends the combination that fits with the least added time; on a tie, the one with fewer
// rungs, then the lower set.
void PriceLadder(const PlanInput& in, Plan* p);

// "per-layer recompute + optimizer-state offload"; "keep all activations" for the empty set.
// Selective recompute is left out of the name when per-layer recompute is in the set.
std::string RungSetName(RungSet set);

}  // namespace tiermem
