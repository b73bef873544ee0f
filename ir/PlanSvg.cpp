// Pictures of a plan (see PlanSvg.h), written as plain SVG text: rectangles with a
// `<title>` each (a tooltip in a browser), labels, and a caption saying what is drawn.
#include "ir/PlanSvg.h"

#include "ir/PipelineSchedule.h"
#include "support/Svg.h"
#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>
#include <sstream>
#include <vector>

namespace epl::ir {

namespace {

// The most work items a picture or timeline draws: a box each. The text plan simulates up
// to ten times more (SchedulePrinter.cpp), where only the bubble is printed.
constexpr int64_t kMaxDrawn = 100000;

// The simulation a plan's pipeline schedule makes, when it can order the plan's shape.
bool simulated(const Module& m, PipelineShape& shape, ScheduleSimulation& sim) {
  if (m.mesh.stages.size() < 2) return false;
  shape = {m.mesh.depth(), static_cast<int>(m.policy.microBatches), m.mesh.chunks};
  if (!scheduleRequirement(m.policy.schedule, shape).empty()) return false;
  if (int64_t{shape.stages} * shape.micros * shape.chunks > kMaxDrawn) return false;
  sim = simulateSchedule(m.policy.schedule, shape);
  return !sim.deadlocked;
}

const char* kindWord(WorkKind k) {
  switch (k) {
  case WorkKind::Forward:
    return "forward";
  case WorkKind::Backward:
    return "backward";
  case WorkKind::BackwardInput:
    return "backward (input gradients)";
  case WorkKind::BackwardWeight:
    return "backward (weight gradients)";
  }
  return "?";
}

const char* kindColour(WorkKind k) {
  switch (k) {
  case WorkKind::Forward:
    return "#4e79a7";
  case WorkKind::Backward:
    return "#f28e2b";
  case WorkKind::BackwardInput:
    return "#e15759";
  case WorkKind::BackwardWeight:
    return "#59a14f";
  }
  return "#999999";
}

std::string scheduleSvg(const Module& m, const PipelineShape& shape,
                        const ScheduleSimulation& sim) {
  const double left = 70, top = 40, row = 28;
  double unit =
      std::clamp(900.0 / static_cast<double>(std::max<int64_t>(sim.makespan, 1)), 4.0, 40.0);
  double width = left + unit * static_cast<double>(sim.makespan) + 20;
  Svg svg(std::max(width, 480.0), top + row * shape.stages + 60);
  svg.text(10, 20,
           fmt::format("{} schedule: {} micro-batch{}, {} stage{}{}; bubble {:.1f}% (forward 1 "
                       "unit, backward {})",
                       scheduleName(m.policy.schedule), shape.micros, shape.micros == 1 ? "" : "es",
                       shape.stages, shape.stages == 1 ? "" : "s",
                       shape.chunks > 1 ? fmt::format(", {} chunks each", shape.chunks) : "",
                       100 * sim.bubble, splitsBackward(m.policy.schedule) ? "1 + 1" : "2"),
           13);
  for (int s = 0; s < shape.stages; ++s) {
    double y = top + row * s;
    svg.text(10, y + row * 0.65, fmt::format("stage {}", s));
    svg.rect(left, y + 2, unit * static_cast<double>(sim.makespan), row - 4, "#eeeeee",
             fmt::format("stage {}: idle where no work is drawn", s));
    for (const ScheduleSimulation::Span& span : sim.timeline[s]) {
      double x = left + unit * static_cast<double>(span.start);
      double w = unit * static_cast<double>(span.end - span.start);
      svg.rect(x, y + 2, w, row - 4, kindColour(span.item.kind),
               fmt::format("stage {}: {} of micro-batch {}{}, time {} to {}", s,
                           kindWord(span.item.kind), span.item.micro,
                           shape.chunks > 1 ? fmt::format(" (chunk {})", span.item.chunk) : "",
                           span.start, span.end));
      if (w >= 14)
        svg.text(x + w / 2, y + row * 0.65, std::to_string(span.item.micro), 10, "middle");
    }
  }
  double y = top + row * shape.stages + 25;
  double x = left;
  for (WorkKind k :
       {WorkKind::Forward, WorkKind::Backward, WorkKind::BackwardInput, WorkKind::BackwardWeight}) {
    if ((k == WorkKind::Backward) == splitsBackward(m.policy.schedule) && k != WorkKind::Forward)
      continue;
    svg.rect(x, y - 10, 12, 12, kindColour(k), kindWord(k));
    svg.text(x + 16, y, kindWord(k), 11);
    x += 190;
  }
  return svg.str();
}

struct LedgerPart {
  const char* name;
  const char* colour;
  int64_t bytes;
};

std::vector<LedgerPart> ledger(const Program& p) {
  return {
      {"activations", "#4e79a7", (p.slots == 1 ? p.arenaBytes : p.activationBytes()) + p.recvBytes},
      {"params", "#f28e2b", p.paramBytes},
      {"grads", "#e15759", p.gradBytes},
      {"optimizer", "#76b7b2", p.optimizerBytes},
      {"staging", "#edc948", p.stagingBytes},
      {"comm buffers", "#b07aa1", p.commBytes},
      {"host inputs", "#9c755f", p.inputBytes}};
}

// One bar a run of consecutive ranks with the same ledger, as `epl plan` prints them.
std::string memorySvg(const Module& m) {
  struct Bar {
    int first, last;
    const Program* p;
  };
  std::vector<Bar> bars;
  auto same = [](const Program& a, const Program& b) {
    std::vector<LedgerPart> x = ledger(a), y = ledger(b);
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].bytes != y[i].bytes) return false;
    return true;
  };
  for (const Program& p : m.programs) {
    if (!bars.empty() && same(*bars.back().p, p))
      bars.back().last = p.rank;
    else
      bars.push_back({p.rank, p.rank, &p});
  }
  int64_t most = 1;
  for (const Bar& b : bars)
    most = std::max(most, b.p->peakBytes());
  const double left = 90, top = 40, row = 26, span = 700;
  Svg svg(left + span + 120, top + row * static_cast<double>(bars.size()) + 50);
  svg.text(10, 20,
           fmt::format("memory per rank: `{}` on {} device{} (what `epl run` allocates)",
                       m.modelName, m.mesh.np, m.mesh.np == 1 ? "" : "s"),
           13);
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    double y = top + row * static_cast<double>(i);
    std::string who = b.first == b.last ? fmt::format("rank {}", b.first)
                                        : fmt::format("ranks {}-{}", b.first, b.last);
    svg.text(10, y + row * 0.65, who);
    double x = left;
    for (const LedgerPart& part : ledger(*b.p)) {
      if (part.bytes == 0) continue;
      double w = span * static_cast<double>(part.bytes) / static_cast<double>(most);
      svg.rect(x, y + 3, w, row - 6, part.colour,
               fmt::format("{}: {} {}", who, part.name, formatBytes(part.bytes)));
      x += w;
    }
    svg.text(x + 6, y + row * 0.65, formatBytes(b.p->peakBytes()), 11);
  }
  double y = top + row * static_cast<double>(bars.size()) + 25, x = left;
  for (const LedgerPart& part : ledger(m.programs.front())) {
    svg.rect(x, y - 10, 12, 12, part.colour, part.name);
    svg.text(x + 16, y, part.name, 11);
    x += 100;
  }
  return svg.str();
}

// Replicas as rows (the first 8), stages as columns, a square a rank; the ranks of one split
// copy share a shade.
std::string meshSvg(const Module& m) {
  const Mesh& mesh = m.mesh;
  int replicas = std::min(mesh.dataParallel, 8);
  const double cell = 22, left = 90, top = 50, gap = 24;
  std::vector<double> x0;
  double x = left;
  for (const StagePlan& st : mesh.stages) {
    x0.push_back(x);
    x += std::max(cell * std::min(st.group, 32), 110.0) + gap; // room for the stage's label
  }
  Svg svg(std::max(x + 20, 640.0), top + (cell + 14) * replicas + 40);
  svg.text(10, 20,
           fmt::format("mesh of `{}`: {} data-parallel x {} stage{} on {} device{}; a square a "
                       "rank, a shade a split copy",
                       m.modelName, mesh.dataParallel, mesh.stages.size(),
                       mesh.stages.size() == 1 ? "" : "s", mesh.np, mesh.np == 1 ? "" : "s"),
           13);
  for (size_t s = 0; s < mesh.stages.size(); ++s)
    svg.text(x0[s], top - 8, fmt::format("stage {} (split {})", s, mesh.stages[s].splitWidth), 11);
  static const char* shades[] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d"};
  for (int r = 0; r < replicas; ++r) {
    double y = top + (cell + 14) * r;
    svg.text(10, y + cell * 0.7, fmt::format("replica {}", r), 11);
    for (size_t s = 0; s < mesh.stages.size(); ++s) {
      const StagePlan& st = mesh.stages[s];
      for (int k = 0; k < std::min(st.group, 32); ++k) {
        int rank = mesh.rank(r, static_cast<int>(s), k);
        int copy = k / std::max(st.splitWidth, 1);
        svg.rect(x0[s] + cell * k, y, cell - 2, cell, shades[copy % 4],
                 fmt::format("rank {}: replica {}, stage {}, split copy {}, split rank {}", rank, r,
                             s, copy, k % std::max(st.splitWidth, 1)));
        if (mesh.np < 1000)
          svg.text(x0[s] + cell * k + (cell - 2) / 2, y + cell * 0.68, std::to_string(rank), 9,
                   "middle");
      }
    }
  }
  if (mesh.dataParallel > replicas)
    svg.text(10, top + (cell + 14) * replicas + 20,
             fmt::format("… and {} more replicas alike", mesh.dataParallel - replicas), 11);
  return svg.str();
}

} // namespace

std::map<std::string, std::string> planSvgs(const Module& m) {
  std::map<std::string, std::string> out;
  out["mesh.svg"] = meshSvg(m);
  if (!m.programs.empty()) out["memory.svg"] = memorySvg(m);
  PipelineShape shape;
  ScheduleSimulation sim;
  if (simulated(m, shape, sim)) out["schedule.svg"] = scheduleSvg(m, shape, sim);
  return out;
}

std::string scheduleTimeline(const Module& m) {
  PipelineShape shape;
  ScheduleSimulation sim;
  if (!simulated(m, shape, sim)) return "";
  constexpr int64_t kUnits = 60; // wider timelines are cut, and say so
  int64_t units = std::min(sim.makespan, kUnits);
  std::string out;
  for (int s = 0; s < shape.stages; ++s) {
    std::vector<std::string> cells(static_cast<size_t>(units), " . ");
    for (const ScheduleSimulation::Span& span : sim.timeline[s])
      for (int64_t t = span.start; t < span.end && t < units; ++t) {
        char k = span.item.kind == WorkKind::Forward         ? 'F'
                 : span.item.kind == WorkKind::Backward      ? 'B'
                 : span.item.kind == WorkKind::BackwardInput ? 'b'
                                                             : 'w';
        cells[static_cast<size_t>(t)] = fmt::format("{}{:<2}", k, span.item.micro);
      }
    out += fmt::format("  stage {} |", s);
    for (const std::string& c : cells)
      out += c;
    out += "\n";
  }
  if (sim.makespan > units)
    out += fmt::format("  (the first {} of {} time units)\n", units, sim.makespan);
  return out;
}

} // namespace epl::ir
