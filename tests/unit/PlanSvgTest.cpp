// `epl plan --svg` and `epl repl`'s timeline: one shape a unit of work the schedule's
// simulation ran, one bar a run of ranks with the same ledger, one square a rank.
#include "ir/PlanSvg.h"
#include "Planned.h"
#include "ir/PipelineSchedule.h"

#include <catch2/catch.hpp>

namespace {

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("the plan's pictures draw every unit of work, rank and ledger") {
  auto m = epl::testing::planned("net.epl", epl::testing::kTwoStages, 4); // 2 copies of 2 stages
  REQUIRE(m);
  std::map<std::string, std::string> svgs = epl::ir::planSvgs(*m);
  REQUIRE(svgs.size() == 3);
  for (const auto& [name, svg] : svgs) {
    CAPTURE(name);
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    CHECK(occurrences(svg, "<rect") ==
          occurrences(svg, "</rect>") + 1); // the background has no title
  }
  // 2 stages x 4 micro-batches, a forward and a backward each.
  const std::string& schedule = svgs.at("schedule.svg");
  CHECK(occurrences(schedule, ": forward of micro-batch") == 8);
  CHECK(occurrences(schedule, ": backward of micro-batch") == 8);
  CHECK(occurrences(schedule, "stage 1: backward of micro-batch 3, time ") == 1);
  // Every rank a square; the ranks of a stage alike.
  const std::string& mesh = svgs.at("mesh.svg");
  for (int r = 0; r < 4; ++r)
    CHECK(occurrences(mesh, "<title>rank " + std::to_string(r) + ":") == 1);
  CHECK(occurrences(svgs.at("memory.svg"), "<title>ranks 0-1: activations") +
            occurrences(svgs.at("memory.svg"), "<title>rank 0: activations") ==
        1);

  // The timeline: one row a stage, each micro-batch's forward once and its backward over
  // two units.
  std::string timeline = epl::ir::scheduleTimeline(*m);
  CAPTURE(timeline);
  REQUIRE(occurrences(timeline, "\n") == 2);
  std::string first = timeline.substr(0, timeline.find('\n'));
  CHECK(occurrences(first, "F") == 4);
  CHECK(occurrences(first, "B") == 8);
  CHECK(first.rfind("  stage 0 |F0 F1 ", 0) == 0);
}

TEST_CASE("a plan of one stage has no schedule picture or timeline") {
  auto m = epl::testing::planned("mlp.epl", epl::testing::kOneStage, 2);
  REQUIRE(m);
  std::map<std::string, std::string> svgs = epl::ir::planSvgs(*m);
  CHECK(svgs.count("schedule.svg") == 0);
  CHECK(svgs.count("mesh.svg") == 1);
  CHECK(epl::ir::scheduleTimeline(*m).empty());
}
