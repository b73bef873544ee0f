// The compiler's pass pipeline, one linear recipe.
#pragma once
#include "passes/Pass.h"

namespace epl::passes {

// Adds every pass, in order, to `pm`.
void buildPipeline(PassManager& pm);

} // namespace epl::passes
