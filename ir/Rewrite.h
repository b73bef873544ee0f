// Small rewrites of a module's op list that keep every op id consistent: the passes after
// autodiff (recompute) insert ops into the program order.
#pragma once
#include "ir/Module.h"

#include <utility>
#include <vector>

namespace epl::ir {

// Inserts each op of `ops` before the op at position `before` of the current list (equal
// positions keep their given order; m.ops.size() appends). The new ops name ids of the
// current list (forward, and the producers of tensors they read); their outputs must be
// tensors whose producer is -1, which become the new ops. Every op id in the module
// (tensor producers, ops' forward, parameters' op, bridges) moves with its op.
void insertOps(Module& m, std::vector<std::pair<int, Op>> ops);

} // namespace epl::ir
