// Checks of the CLI's numeric options, with messages that name the bound crossed:
// `--steps must be at least 1, got `0``. CLI11's own range checks print their bounds as
// doubles (309 digits for "no upper bound"), take `1e3` for an integer and let `nan` and
// `inf` through.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace epl::driver {

// A mistake on the command line found while parsing it: main prints `error: ` and the
// message, and exits 2 (usage). Thrown from a validator, so that CLI11 does not reword it.
class UsageError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The option `name` takes a whole number from lo to hi.
CLI::Validator wholeNumber(const std::string& name, int64_t lo, int64_t hi);
// The option `name` takes a positive, finite number.
CLI::Validator positiveNumber(const std::string& name);

} // namespace epl::driver
