// The measured bubble of a traced pipeline step: every rank's idle time within one window
// per step, from the first rank's start to the last rank's end.
#include "interp/Trace.h"

#include <catch2/catch.hpp>

using epl::interp::RankTrace;
using epl::interp::TraceEvent;
using epl::interp::Track;

namespace {

RankTrace rank(double start, double end, std::vector<std::pair<double, double>> compute,
               double transfer = 0) {
  RankTrace r;
  r.steps.push_back({0, start, end});
  for (auto [a, b] : compute)
    r.events.push_back(TraceEvent{"fwd", 0, 0, Track::Compute, a, b});
  if (transfer > 0) r.events.push_back(TraceEvent{"send", 0, 0, Track::Communication, 0, transfer});
  return r;
}

} // namespace

TEST_CASE("the measured bubble counts a rank that finished early as idle until the step ends") {
  // Rank 0 computes 60 of its 100 us; rank 1 computes all of its 80 us, then idles until
  // rank 0 ends: 140 of 2 x 100 us busy.
  int steps = 0;
  double bubble = epl::interp::measuredBubble(
      {rank(0, 100, {{0, 30}, {70, 100}}, 40), rank(0, 80, {{0, 80}})}, &steps);
  CHECK(steps == 1);
  CHECK(bubble == Approx(0.3));
}

TEST_CASE("the measured bubble averages over steps, and communication is not compute") {
  RankTrace a = rank(0, 100, {{0, 100}});
  a.steps.push_back({1, 100, 200});
  a.events.push_back(TraceEvent{"fwd", 1, 0, Track::Compute, 100, 150});
  a.events.push_back(TraceEvent{"recv", 1, 0, Track::Communication, 150, 200});
  int steps = 0;
  // Step 0: no idle time; step 1: half of it.
  CHECK(epl::interp::measuredBubble({a}, &steps) == Approx(0.25));
  CHECK(steps == 2);
}

TEST_CASE("a step's window starts with the read of its batch, which is compute") {
  epl::interp::TraceRecorder r;
  double read = r.nowUs() + 1e9; // far from the clock's now
  r.readBatch(3, read, read + 10);
  r.beginStep(3);
  r.endStep();
  r.beginStep(4); // no read recorded for step 4: its window starts when the executor does
  r.endStep();
  REQUIRE(r.steps().size() == 2);
  CHECK(r.steps()[0].startUs == read);
  CHECK(r.steps()[1].startUs < read);
  REQUIRE(r.events().size() == 1);
  CHECK(r.events()[0].name == "read");
  CHECK(r.events()[0].step == 3);
  CHECK(r.events()[0].track == Track::Compute);
}
