// Pictures of a plan (`epl plan --svg DIR`) and the schedule as a text timeline (`epl
// repl`'s `schedule`): the pipeline schedule as a Gantt chart, one row a stage; the memory
// ledger as stacked bars, one a rank; the mesh, ranks grouped by replica, stage and split.
#pragma once
#include "ir/Module.h"

#include <map>
#include <string>

namespace epl::ir {

// File name -> SVG text: `mesh.svg` always, `memory.svg` for plans with rank programs,
// `schedule.svg` for pipelines whose schedule the simulation orders.
std::map<std::string, std::string> planSvgs(const Module& m);

// A pipeline's simulated schedule, one row a stage and three characters a time unit
// (`F3` the forward of micro-batch 3, `B3` its backward over two units, `b`/`w` a split
// backward's input and weight parts, `.` idle); empty for one stage.
std::string scheduleTimeline(const Module& m);

} // namespace epl::ir
