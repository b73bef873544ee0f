// Structural checks of a Module; a failure is a compiler bug, not a user mistake.
#pragma once
#include "ir/Module.h"

#include <string>
#include <vector>

namespace epl::ir {

// Every broken invariant, one message each; empty when the module is well formed.
std::vector<std::string> verify(const Module& m);

} // namespace epl::ir
