// Pipeline schedules against their specification: the ordering rules every schedule keeps,
// and bubble and in-flight figures against the closed forms of GPipe, 1F1B (Narayanan et
// al.), interleaved 1F1B (Megatron-LM) and ZB-H1 (Qi et al.) under the unit cost model.
#include "ir/PipelineSchedule.h"

#include <catch2/catch.hpp>
#include <map>
#include <tuple>

using epl::ir::PipelineShape;
using epl::ir::Schedule;
using epl::ir::WorkItem;
using epl::ir::WorkKind;

namespace {

const Schedule kAll[] = {Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved,
                         Schedule::ZeroBubble};

// Rules 1-3 of ir/PipelineSchedule.cpp for one stage's order.
void checkStageRules(Schedule sched, const std::vector<WorkItem>& order, const PipelineShape& sh) {
  std::map<std::tuple<int, WorkKind, int>, size_t> at; // (micro, kind, chunk) -> position
  for (size_t i = 0; i < order.size(); ++i) {
    const WorkItem& w = order[i];
    REQUIRE(w.micro >= 0);
    REQUIRE(w.micro < sh.micros);
    REQUIRE(w.chunk >= 0);
    REQUIRE(w.chunk < sh.chunks);
    bool fresh = at.emplace(std::make_tuple(w.micro, w.kind, w.chunk), i).second;
    REQUIRE(fresh); // appears once
  }
  bool split = epl::ir::splitsBackward(sched);
  REQUIRE(order.size() == static_cast<size_t>(sh.micros * sh.chunks * (split ? 3 : 2)));
  WorkKind b = split ? WorkKind::BackwardInput : WorkKind::Backward;
  for (int c = 0; c < sh.chunks; ++c)
    for (int i = 0; i < sh.micros; ++i) {
      REQUIRE(at.count({i, WorkKind::Forward, c}));
      REQUIRE(at.count({i, b, c}));
      CHECK(at[{i, WorkKind::Forward, c}] < at[{i, b, c}]);
      if (split) CHECK(at[{i, b, c}] < at[{i, WorkKind::BackwardWeight, c}]);
      if (i == 0) continue;
      CHECK(at[{i - 1, b, c}] < at[{i, b, c}]); // gradients add micro-batches in order
      if (split)
        CHECK(at[{i - 1, WorkKind::BackwardWeight, c}] < at[{i, WorkKind::BackwardWeight, c}]);
    }
}

} // namespace

TEST_CASE("every schedule keeps the ordering rules and finishes", "[schedule]") {
  for (Schedule sched : kAll)
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 13; ++m)
        for (int v = 1; v <= (sched == Schedule::Interleaved ? 3 : 1); ++v) {
          PipelineShape sh{p, m, v};
          if (!epl::ir::scheduleRequirement(sched, sh).empty()) continue;
          INFO(epl::ir::scheduleName(sched) << " p = " << p << " m = " << m << " v = " << v);
          for (int s = 0; s < p; ++s)
            checkStageRules(sched, epl::ir::stageOrder(sched, s, sh), sh);
          CHECK_FALSE(epl::ir::simulateSchedule(sched, sh).deadlocked);
        }
}

TEST_CASE("GPipe and 1F1B: bubble (p - 1) / (m + p - 1), in flight m and min(p - s, m)",
          "[schedule]") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      INFO("p = " << p << " m = " << m);
      PipelineShape sh{p, m, 1};
      auto gpipe = epl::ir::simulateSchedule(Schedule::GPipe, sh);
      auto ofob = epl::ir::simulateSchedule(Schedule::OneFOneB, sh);
      // Each stage works 3m units; the last micro-batch's F and B cross p - 1 more stages.
      CHECK(gpipe.makespan == 3 * (m + p - 1));
      CHECK(ofob.makespan == 3 * (m + p - 1));
      CHECK(gpipe.bubble == Approx(static_cast<double>(p - 1) / (m + p - 1)));
      CHECK(ofob.bubble == Approx(epl::ir::classicBubble(sh)));
      for (int s = 0; s < p; ++s) {
        CHECK(gpipe.peakInFlight[s] == m);
        CHECK(ofob.peakInFlight[s] == std::min(p - s, m));
      }
    }
}

TEST_CASE("ZB-H1: no more bubble or activations than 1F1B, and a third of its bubble",
          "[schedule]") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      INFO("p = " << p << " m = " << m);
      PipelineShape sh{p, m, 1};
      auto ofob = epl::ir::simulateSchedule(Schedule::OneFOneB, sh);
      auto zb = epl::ir::simulateSchedule(Schedule::ZeroBubble, sh);
      CHECK(zb.bubble <= ofob.bubble + 1e-12);
      for (int s = 0; s < p; ++s)
        CHECK(zb.peakInFlight[s] <= ofob.peakInFlight[s]);
      // With m >= p the bubble is (p - 1) units per stage of 3m work: (p - 1)(F + B - W).
      if (m >= p) CHECK(zb.makespan == 3 * m + p - 1);
    }
}

TEST_CASE("ZB-H1 keeps at most p micro-batches between F and W on every stage", "[schedule]") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m)
      for (int s = 0; s < p; ++s) {
        int held = 0, peak = 0;
        for (const WorkItem& w : epl::ir::stageOrder(Schedule::ZeroBubble, s, {p, m, 1})) {
          held += w.kind == WorkKind::Forward ? 1 : w.kind == WorkKind::BackwardWeight ? -1 : 0;
          peak = std::max(peak, held);
        }
        CHECK(peak <= std::min(p, m));
        CHECK(epl::ir::simulateSchedule(Schedule::ZeroBubble, {p, m, 1}).peakHeld[s] == peak);
      }
}

TEST_CASE("interleaved 1F1B: bubble (p - 1) / (v m + p - 1), below 1F1B's for v >= 2",
          "[schedule]") {
  for (int p = 2; p <= 6; ++p)
    for (int m = p; m <= 4 * p; m += p)
      for (int v = 1; v <= 4; ++v) {
        INFO("p = " << p << " m = " << m << " v = " << v);
        PipelineShape sh{p, m, v};
        auto inter = epl::ir::simulateSchedule(Schedule::Interleaved, sh);
        // Megatron-LM: the bubble is (p - 1) / (v m) of the ideal time, a fraction
        // (p - 1) / (v m + p - 1) of the whole.
        CHECK(inter.bubble == Approx(static_cast<double>(p - 1) / (v * m + p - 1)));
        auto ofob = epl::ir::simulateSchedule(Schedule::OneFOneB, {p, m, 1});
        if (v >= 2) CHECK(inter.bubble < ofob.bubble);
        if (v == 1) CHECK(inter.peakInFlight == ofob.peakInFlight);
      }
}

TEST_CASE("interleaved needs micro-batches in rounds of the stages", "[schedule]") {
  CHECK(epl::ir::scheduleRequirement(Schedule::Interleaved, {4, 6, 2}) ==
        "needs micro_batches (6) to be a multiple of the 4 pipeline stages");
  CHECK(epl::ir::scheduleRequirement(Schedule::Interleaved, {4, 8, 2}).empty());
  CHECK(epl::ir::scheduleRequirement(Schedule::OneFOneB, {4, 6, 1}).empty());
}

TEST_CASE("the simulation finds a deadlock", "[schedule]") {
  // Stage 1 waits for the backward of micro-batch 0 before running its forward.
  std::vector<std::vector<WorkItem>> orders = {
      {{0, WorkKind::Forward, 0}, {0, WorkKind::Backward, 0}},
      {{0, WorkKind::Backward, 0}, {0, WorkKind::Forward, 0}}};
  CHECK(epl::ir::simulateOrders(orders, {2, 1, 1}).deadlocked);
}

TEST_CASE("1F1B on 4 stages and 8 micro-batches, stage 2", "[schedule]") {
  std::vector<WorkItem> want = {
      {0, WorkKind::Forward, 0},  {1, WorkKind::Forward, 0},  {0, WorkKind::Backward, 0},
      {2, WorkKind::Forward, 0},  {1, WorkKind::Backward, 0}, {3, WorkKind::Forward, 0},
      {2, WorkKind::Backward, 0}, {4, WorkKind::Forward, 0},  {3, WorkKind::Backward, 0},
      {5, WorkKind::Forward, 0},  {4, WorkKind::Backward, 0}, {6, WorkKind::Forward, 0},
      {5, WorkKind::Backward, 0}, {7, WorkKind::Forward, 0},  {6, WorkKind::Backward, 0},
      {7, WorkKind::Backward, 0}};
  CHECK(epl::ir::stageOrder(Schedule::OneFOneB, 2, {4, 8, 1}) == want);
}
