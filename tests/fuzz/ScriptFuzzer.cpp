// The front end and the planner on any bytes as a script, as `epl check` runs them (with the
// IR verified after every pass). A mistake in the script is a diagnostic; a crash, a hang, a
// sanitizer report or an internal error (EPL_ASSERT aborts) is a finding.
#include "lib/Epl.h"

#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  epl::Session session;
  epl::PlanOptions options;
  options.verifyEach = true;
  epl::planText("fuzz.epl", text, session, options);
  return 0;
}
