// Pipeline schedules and their simulation. Notation: p stages, m micro-batches, v chunks,
// stage s (0 first), F forward, B backward (whole, or input gradient), W weight gradient.
//
// Every schedule keeps these rules, and tests/unit/PipelineScheduleTest.cpp checks them:
//   1. each (micro-batch, kind, chunk) appears exactly once on a stage;
//   2. B of a micro-batch comes after its F, W after its B;
//   3. per chunk, B and W run in increasing micro-batch order, so gradients accumulate
//      micro-batches in the order one device adds them;
//   4. all stages together finish: simulateOrders() does not deadlock.
#include "ir/PipelineSchedule.h"

#include "support/Assert.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir {

namespace {

WorkItem forward(int micro, int chunk = 0) {
  return {micro, WorkKind::Forward, chunk};
}
WorkItem backward(int micro, int chunk = 0) {
  return {micro, WorkKind::Backward, chunk};
}

// GPipe: all forwards, then all backwards.
std::vector<WorkItem> gpipe(const PipelineShape& sh) {
  std::vector<WorkItem> out;
  for (int i = 0; i < sh.micros; ++i)
    out.push_back(forward(i));
  for (int i = 0; i < sh.micros; ++i)
    out.push_back(backward(i));
  return out;
}

// 1F1B: p - s - 1 warm-up forwards, then one forward and one backward in turn, then the
// remaining backwards. At most p - s micro-batches are in flight on stage s.
std::vector<WorkItem> oneFOneB(int s, const PipelineShape& sh) {
  int m = sh.micros, warmup = std::min(sh.stages - s - 1, m);
  std::vector<WorkItem> out;
  for (int i = 0; i < warmup; ++i)
    out.push_back(forward(i));
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back(forward(warmup + i));
    out.push_back(backward(i));
  }
  for (int i = m - warmup; i < m; ++i)
    out.push_back(backward(i));
  return out;
}

// ZB-H1 (Qi et al., 2024), with the backward split into B and W:
//   1. p - s warm-up forwards (one more than 1F1B: B no longer waits for W downstream,
//      so the first B arrives one W earlier);
//   2. steady state: B(i), then W(i - s) once i >= s, then the next forward. Stage s defers
//      s weight gradients, which keeps at most p micro-batches between F and W on every
//      stage, and p - s between F and B, as 1F1B;
//   3. cool-down: each remaining B followed by the oldest deferred W; then the last Ws,
//      which fill the bubble 1F1B leaves at the end.
std::vector<WorkItem> zeroBubbleH1(int s, const PipelineShape& sh) {
  int m = sh.micros, warmup = std::min(sh.stages - s, m), nextW = 0;
  std::vector<WorkItem> out;
  auto weight = [&] { out.push_back({nextW++, WorkKind::BackwardWeight, 0}); };
  for (int i = 0; i < warmup; ++i)
    out.push_back(forward(i));
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back({i, WorkKind::BackwardInput, 0});
    if (i >= s) weight();
    out.push_back(forward(warmup + i));
  }
  for (int i = m - warmup; i < m; ++i) {
    out.push_back({i, WorkKind::BackwardInput, 0});
    weight();
  }
  while (nextW < m)
    weight();
  return out;
}

// Interleaved 1F1B (Narayanan et al., 2021, as in Megatron-LM) with v chunks per stage:
//   1. work goes in rounds of p micro-batches: the k-th forward is micro-batch
//      (k / pv) * p + k % p of chunk (k % pv) / p, the k-th backward the same micro-batch
//      of chunk v - 1 - (k % pv) / p;
//   2. 2 (p - s - 1) + (v - 1) p warm-up forwards (all of them when m = p), then one
//      forward and one backward in turn, then the remaining backwards.
std::vector<WorkItem> interleaved(int s, const PipelineShape& sh) {
  int p = sh.stages, v = sh.chunks, total = sh.micros * v, round = p * v;
  auto nth = [&](int k, bool isForward) {
    int r = k % round, micro = (k / round) * p + r % p, chunk = r / p;
    return isForward ? forward(micro, chunk) : backward(micro, v - 1 - chunk);
  };
  int warmup = sh.micros == p ? total : std::min(2 * (p - s - 1) + (v - 1) * p, total);
  std::vector<WorkItem> out;
  for (int k = 0; k < warmup; ++k)
    out.push_back(nth(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(nth(warmup + k, true));
    out.push_back(nth(k, false));
  }
  for (int k = std::max(total - warmup, 0); k < total; ++k)
    out.push_back(nth(k, false));
  return out;
}

// Finish times of every item of a shape, -1 until it ran. B slots hold Backward or
// BackwardInput, whichever the schedule emits.
class FinishTimes {
public:
  explicit FinishTimes(const PipelineShape& sh)
      : sh_(sh), t_(static_cast<size_t>(sh.stages) * sh.chunks * sh.micros * 3, -1) {}
  int64_t& at(int stage, int chunk, int micro, WorkKind k) {
    int slot = k == WorkKind::Forward ? 0 : k == WorkKind::BackwardWeight ? 2 : 1;
    size_t i = ((static_cast<size_t>(stage) * sh_.chunks + chunk) * sh_.micros + micro) * 3;
    return t_[i + slot];
  }

private:
  PipelineShape sh_;
  std::vector<int64_t> t_;
};

// The finish times item `w` of stage `s` waits for (rule 4's dependencies).
std::vector<int64_t> dependencies(FinishTimes& done, int s, const WorkItem& w,
                                  const PipelineShape& sh) {
  int p = sh.stages, virt = w.chunk * p + s, last = p * sh.chunks - 1;
  switch (w.kind) {
  case WorkKind::Forward:
    if (virt == 0) return {};
    return {done.at((virt - 1) % p, (virt - 1) / p, w.micro, WorkKind::Forward)};
  case WorkKind::Backward:
  case WorkKind::BackwardInput: {
    int64_t own = done.at(s, w.chunk, w.micro, WorkKind::Forward);
    if (virt == last) return {own};
    return {own, done.at((virt + 1) % p, (virt + 1) / p, w.micro, WorkKind::BackwardInput)};
  }
  case WorkKind::BackwardWeight:
    return {done.at(s, w.chunk, w.micro, WorkKind::BackwardInput)};
  }
  return {};
}

} // namespace

const char* scheduleName(Schedule s) {
  switch (s) {
  case Schedule::GPipe:
    return "gpipe";
  case Schedule::OneFOneB:
    return "1f1b";
  case Schedule::Interleaved:
    return "interleaved";
  case Schedule::ZeroBubble:
    return "zb";
  }
  return "?";
}

bool splitsBackward(Schedule s) {
  return s == Schedule::ZeroBubble;
}

std::string scheduleRequirement(Schedule s, const PipelineShape& shape) {
  if (s == Schedule::Interleaved && shape.micros % shape.stages != 0)
    return fmt::format("needs micro_batches ({}) to be a multiple of the {} pipeline stages",
                       shape.micros, shape.stages);
  return "";
}

std::vector<WorkItem> stageOrder(Schedule s, int stage, const PipelineShape& shape) {
  EPL_ASSERT(stage >= 0 && stage < shape.stages && shape.micros >= 1 && shape.chunks >= 1,
             "pipeline shape out of range");
  EPL_ASSERT(scheduleRequirement(s, shape).empty(), "schedule cannot order this pipeline");
  EPL_ASSERT(shape.chunks == 1 || s == Schedule::Interleaved, "only interleaved has chunks");
  switch (s) {
  case Schedule::GPipe:
    return gpipe(shape);
  case Schedule::OneFOneB:
    return oneFOneB(stage, shape);
  case Schedule::Interleaved:
    return shape.chunks == 1 ? oneFOneB(stage, shape) : interleaved(stage, shape);
  case Schedule::ZeroBubble:
    return zeroBubbleH1(stage, shape);
  }
  return {};
}

int64_t workCost(WorkKind k) {
  return k == WorkKind::Backward ? 2 : 1;
}

// List scheduling over the fixed orders: sweep the stages, starting each stage's next items
// while their dependencies are done, until a sweep starts nothing. Start times do not depend
// on the sweep order, since each is max(stage free, dependencies finished).
ScheduleSimulation simulateOrders(const std::vector<std::vector<WorkItem>>& orders,
                                  const PipelineShape& shape) {
  EPL_ASSERT(static_cast<int>(orders.size()) == shape.stages, "one order per stage");
  FinishTimes done(shape);
  int p = shape.stages;
  std::vector<size_t> next(p, 0);
  std::vector<int64_t> free(p, 0);
  std::vector<int> inFlight(p, 0), held(p, 0);
  ScheduleSimulation out;
  out.peakInFlight.assign(p, 0);
  out.peakHeld.assign(p, 0);
  out.timeline.resize(p);
  int64_t busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s)
      for (; next[s] < orders[s].size(); ++next[s]) {
        const WorkItem& w = orders[s][next[s]];
        EPL_ASSERT(w.micro >= 0 && w.micro < shape.micros && w.chunk >= 0 && w.chunk < shape.chunks,
                   "work item out of range");
        std::vector<int64_t> deps = dependencies(done, s, w, shape);
        if (std::any_of(deps.begin(), deps.end(), [](int64_t t) { return t < 0; })) break;
        int64_t start =
            std::max(free[s], deps.empty() ? 0 : *std::max_element(deps.begin(), deps.end()));
        free[s] = done.at(s, w.chunk, w.micro, w.kind) = start + workCost(w.kind);
        out.timeline[s].push_back({w, start, free[s]});
        busy += workCost(w.kind);
        inFlight[s] += w.kind == WorkKind::Forward          ? 1
                       : w.kind == WorkKind::BackwardWeight ? 0
                                                            : -1;
        out.peakInFlight[s] = std::max(out.peakInFlight[s], inFlight[s]);
        held[s] += w.kind == WorkKind::Forward ? 1 : w.kind == WorkKind::BackwardInput ? 0 : -1;
        out.peakHeld[s] = std::max(out.peakHeld[s], held[s]);
        progress = true;
      }
  }
  for (int s = 0; s < p; ++s)
    out.deadlocked = out.deadlocked || next[s] < orders[s].size();
  out.makespan = *std::max_element(free.begin(), free.end());
  if (out.makespan > 0) out.bubble = 1.0 - static_cast<double>(busy) / (1.0 * p * out.makespan);
  return out;
}

ScheduleSimulation simulateSchedule(Schedule s, const PipelineShape& shape) {
  std::vector<std::vector<WorkItem>> orders;
  for (int stage = 0; stage < shape.stages; ++stage)
    orders.push_back(stageOrder(s, stage, shape));
  return simulateOrders(orders, shape);
}

double classicBubble(const PipelineShape& shape) {
  return static_cast<double>(shape.stages - 1) / (shape.micros + shape.stages - 1);
}

} // namespace epl::ir
