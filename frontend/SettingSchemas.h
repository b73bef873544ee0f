// The tables behind `policy` and `train` checking: call-shaped values (data sources,
// optimizers, lr schedules) with their arguments and ranges. Internal to frontend/.
#pragma once
#include "frontend/Settings.h"

#include <string>
#include <vector>

namespace epl::frontend {

enum class ArgType { String, Number, Integer };

// One argument of a call-shaped value, with the range its number must lie in.
struct CallArg {
  std::string name;
  ArgType type = ArgType::Number;
  bool required = false;
  double lo = 0, hi = 1e300;
  bool loOpen = false; // lo itself is not allowed (a learning rate must be > 0)
};

// Call-shaped values a key accepts: `adamw(lr = 3e-4)`, `tokens("x.bin", seq = 128)`.
struct CallSchema {
  std::string group; // data, optimizer, lr_schedule
  std::string name;
  std::vector<CallArg> args;
  std::string doc;
};

const std::vector<CallSchema>& callSchemas();

} // namespace epl::frontend
