// What a run shows while it trains: the ETA of a resumed run, from the steps done since it
// started rather than since step 0.
#include "interp/Progress.h"

#include <catch2/catch.hpp>

#include <sstream>

using namespace epl::interp;
using Catch::Matchers::Contains;

namespace {

// The log line of one step of 2000 in a run that started at `firstStep` and has taken
// `elapsed` seconds so far.
std::string logLine(int64_t firstStep, int64_t step, double elapsed) {
  std::ostringstream out;
  Progress progress(out, false, 1);
  StepReport r;
  r.step = step;
  r.steps = 2000;
  r.firstStep = firstStep;
  r.elapsedSeconds = elapsed;
  progress.step(r);
  return out.str();
}

} // namespace

TEST_CASE("the ETA counts the steps of this run", "[progress]") {
  // 2 s a step: 999 steps to go take 1998 s, whether the run started at 0 or resumed.
  CHECK_THAT(logLine(0, 1001, 2002), Contains("ETA 33m18s"));
  CHECK_THAT(logLine(1000, 1001, 2), Contains("ETA 33m18s"));
  CHECK_THAT(logLine(1000, 1010, 20), Contains("ETA 33m00s"));
}
