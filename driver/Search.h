// `epl plan --cluster C --search`: the policy settings a script's layout runs best with on C.
#pragma once
#include "ir/Cluster.h"
#include "lib/Epl.h"

#include <ostream>
#include <string>

namespace epl::driver {

// Plans the script under other layouts (the stage counts, split widths and layers per
// stage its text writes, ir::LayoutKnob) and every combination of micro_batches, schedule
// (with a pipeline), zero (with data parallelism) and recompute, as cost-only plans;
// predicts each on `cluster`, and prints the fastest that fit the devices' memory, why
// the others lost, and the winner as --set options and as a diff of the script
// (docs/cluster.md). 0, or 1 when no candidate plans or fits.
int searchPolicy(const std::string& script, const PlanOptions& scriptOptions,
                 const ir::Cluster& cluster, std::ostream& out);

} // namespace epl::driver
