// The typed keys of `policy { … }` and `train model { … }`: name, type, default and meaning.
// docs/language.md documents each; a test keeps the two in step.
#pragma once
#include <string>
#include <vector>

namespace epl::frontend {

struct KeyDoc {
  std::string name;
  std::string type;
  std::string defaultValue;
  std::string doc;
};

const std::vector<KeyDoc>& policyKeys();
const std::vector<KeyDoc>& trainKeys();
// Call-shaped values: data sources, optimizers, lr schedules (name and keyword arguments).
const std::vector<KeyDoc>& settingCalls();

} // namespace epl::frontend
