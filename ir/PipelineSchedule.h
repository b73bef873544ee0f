// Pipeline schedules as objects: the order in which one pipeline stage runs the forward and
// backward work of every micro-batch, and a simulation of all stages together that measures
// a schedule's bubble and the activations it keeps in flight. The plan prints these; the
// runtime's stream builder will follow the same orders.
#pragma once
#include "ir/Config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace epl::ir {

// One piece of a stage's work for one micro-batch and model chunk. Schedules that keep the
// backward whole emit `Backward` (input and weight gradients in one pass); zero-bubble
// schedules split it into `BackwardInput` (sent upstream at once) and `BackwardWeight`.
enum class WorkKind { Forward, Backward, BackwardInput, BackwardWeight };

struct WorkItem {
  int micro = 0;
  WorkKind kind = WorkKind::Forward;
  int chunk = 0; // model chunk on this stage's devices; 0 unless interleaved
  bool operator==(const WorkItem& o) const {
    return micro == o.micro && kind == o.kind && chunk == o.chunk;
  }
};

// The size of a pipeline: p stages (device groups), m micro-batches per step, v model
// chunks per stage. Model chunk c of stage s is virtual stage c * p + s; activations flow
// through the virtual stages in order.
struct PipelineShape {
  int stages = 1;
  int micros = 1;
  int chunks = 1;
};

const char* scheduleName(Schedule s); // the policy word: "gpipe", "1f1b", …
bool splitsBackward(Schedule s);      // emits BackwardInput and BackwardWeight
// Why `s` cannot order `shape` ("needs …"), or empty when it can: interleaved needs the
// micro-batches to be a multiple of the stages (its rounds are p micro-batches long), also with one
// chunk, where it orders as 1F1B, so a script stays valid when its stages gain chunks.
std::string scheduleRequirement(Schedule s, const PipelineShape& shape);

// The order stage `stage` runs its work items in. Requires scheduleRequirement() empty.
std::vector<WorkItem> stageOrder(Schedule s, int stage, const PipelineShape& shape);

// Unit costs of the simulation: F = 1 and a whole backward = 2; split, B = 1 and W = 1.
// Transfers between stages take no time.
int64_t workCost(WorkKind k);

struct ScheduleSimulation {
  bool deadlocked = false; // some stage waits forever on work no stage can reach
  int64_t makespan = 0;    // time from the first forward to the last backward
  double bubble = 0;       // idle fraction of stages x makespan
  // Per stage: the most (micro-batch, chunk) pairs whose forward ran and whose backward
  // (the whole one, or its input-gradient part) has not.
  std::vector<int> peakInFlight;
  // Per stage: the most whose forward ran and whose weight gradient (W, or the whole
  // backward) has not: the activations the stage holds, which W reads too.
  std::vector<int> peakHeld;
  // Per stage, the work it ran in order, each from `start` to `end` in unit costs: the
  // timeline `epl plan --svg` and `epl repl`'s `schedule` draw.
  struct Span {
    WorkItem item;
    int64_t start = 0, end = 0;
  };
  std::vector<std::vector<Span>> timeline;
};

// Runs the orders of all stages (orders[s] for stage s) together: each item starts when its
// stage is free and its dependencies are done (F of the previous virtual stage; B of the
// next virtual stage and F on this one; W after B on this one).
ScheduleSimulation simulateOrders(const std::vector<std::vector<WorkItem>>& orders,
                                  const PipelineShape& shape);
ScheduleSimulation simulateSchedule(Schedule s, const PipelineShape& shape);

// GPipe's and 1F1B's bubble with whole backwards: (p - 1) / (m + p - 1).
double classicBubble(const PipelineShape& shape);

} // namespace epl::ir
