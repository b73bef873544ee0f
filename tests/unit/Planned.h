// A script planned for a device count, for the tests of what the planner and the schedule
// make of it: any diagnostic fails the running test.
#pragma once
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>

namespace epl::testing {

inline std::optional<ir::Module> planned(const std::string& file, const std::string& text, int np) {
  Session session;
  PlanOptions options;
  options.np = np;
  auto m = planText(file, text, session, options);
  for (const auto& d : session.diags.all())
    FAIL(d.message);
  return m;
}

} // namespace epl::testing
