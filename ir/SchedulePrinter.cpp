// The plan's pipeline-schedule section: what the policy's schedule costs in bubble and in
// activations held, from a simulation of its stage orders (ir/PipelineSchedule.h).
#include "ir/PipelineSchedule.h"
#include "ir/Printer.h"
#include "support/Assert.h"
#include "support/Checked.h"
#include "support/Text.h"

#include <fmt/format.h>
#include <set>

namespace epl::ir {

namespace {

// Past this many (stage, micro-batch, chunk) triples the plan prints the formula only.
constexpr int64_t kMaxSimulated = 1'000'000;

// Bytes one device of stage `s`'s group holds of tensor t with the batch bound to its
// share of a micro-batch: 1/G of it for data-parallel tensors, its copy's 1/c otherwise
// (a stage of split regions only spreads the batch over copies), and 1/w of that when cut.
int64_t deviceBytes(const Module& m, int s, int t) {
  const StagePlan& st = m.mesh.stages[s];
  const Tensor& tensor = m.tensors[t];
  bool dataParallel = tensor.layout.kind == LayoutKind::DataParallel && !st.allSplit;
  auto bindings = m.bindings;
  bindings[m.batchSymbol] = m.mesh.microBatch / (dataParallel ? st.group : st.copies());
  auto n = numElements(tensor.type.shape, bindings);
  EPL_ASSERT(n.has_value(), "activation size unbound after mesh-assignment");
  auto bytes = checkedMul(*n, dtypeBytes(m.storedDtype(t)));
  EPL_ASSERT(bytes.has_value(), "activation bytes past 2^63 - 1 after mesh-assignment");
  return tensor.layout.kind == LayoutKind::Sharded ? *bytes / st.splitWidth : *bytes;
}

// The activations one micro-batch leaves on each device of stage `s` for its backward: the
// stage's forward tensors (and the model inputs) that its backward ops read.
int64_t activationBytes(const Module& m, int s) {
  std::set<int> read;
  std::set<int> inputs(m.inputs.begin(), m.inputs.end());
  for (const Op& op : m.ops) {
    if (op.phase != Phase::Backward || op.stage != s) continue;
    for (int t : op.inputs) {
      if (t < 0) continue;
      int producer = m.tensors[t].producer;
      bool forward =
          producer >= 0 && m.ops[producer].phase == Phase::Forward && m.ops[producer].stage == s;
      if (forward || inputs.count(t)) read.insert(t);
    }
  }
  int64_t total = 0;
  for (int t : read)
    total += deviceBytes(m, s, t);
  return total;
}

std::string percent(double f) {
  return fmt::format("{:.1f}%", 100 * f);
}

} // namespace

void printScheduleSection(const Module& m, std::ostream& out) {
  int p = m.mesh.depth();
  if (m.mesh.stages.size() < 2) return;
  // Stage blocks sharing a device group (`chunks`) are one stage's model chunks: block k
  // is chunk k / p of stage k mod p.
  PipelineShape shape{p, static_cast<int>(m.policy.microBatches), m.mesh.chunks};
  Schedule sched = m.policy.schedule;
  out << fmt::format("\npipeline schedule: {}, {} micro-batch{} over {} stages, {} chunk{} per "
                     "stage\n",
                     scheduleName(sched), shape.micros, shape.micros == 1 ? "" : "es", p,
                     shape.chunks, shape.chunks == 1 ? "" : "s");
  std::string classic = fmt::format("(p - 1) / (m + p - 1) = {}", percent(classicBubble(shape)));
  if (!scheduleRequirement(sched, shape).empty() ||
      int64_t{p} * shape.micros * shape.chunks > kMaxSimulated) {
    out << fmt::format("  bubble: not simulated; {}\n", classic);
    return;
  }
  ScheduleSimulation sim = simulateSchedule(sched, shape);
  EPL_ASSERT(!sim.deadlocked, "a pipeline schedule deadlocked");
  out << fmt::format("  bubble: {} simulated (F = 1, {} time units); {}\n", percent(sim.bubble),
                     splitsBackward(sched) ? "B = 1, W = 1" : "B = 2", classic);
  bool trained = m.lossGrad >= 0 && m.mesh.microBatch > 0; // autodiff made backward ops
  for (int s = 0; s < p; ++s) {
    int n = sim.peakInFlight[s];
    // With chunks the simulation counts (micro-batch, chunk) pairs.
    out << fmt::format("  stage {}: at most {} {}{} in flight", s, n,
                       shape.chunks > 1 ? "(micro-batch, chunk) pair" : "micro-batch",
                       n == 1             ? ""
                       : shape.chunks > 1 ? "s"
                                          : "es");
    // A split backward keeps a micro-batch's activations until its W, not its B.
    if (splitsBackward(sched)) {
      n = sim.peakHeld[s];
      out << fmt::format(", {} held until W", n);
    }
    if (trained) {
      // With chunks, a (micro-batch, chunk) pair holds the largest chunk's at most.
      int64_t largest = 0;
      for (int c = 0; c < shape.chunks; ++c)
        largest = std::max(largest, activationBytes(m, c * p + s));
      double each = static_cast<double>(largest);
      out << fmt::format(", activations {} per device ({} each)", formatBytes(n * each),
                         formatBytes(each));
    }
    out << "\n";
  }
  // The backward's transfers: each boundary's gradient goes back to the stage it came from,
  // each device of that stage getting the gradient of what it sent.
  for (const Bridge& b : m.bridges) {
    if (!trained || b.fromStage == b.toStage || b.bytes < 0) continue;
    double back = static_cast<double>(b.bytes) * m.mesh.stages[b.toStage].group /
                  m.mesh.stages[b.fromStage].group;
    out << fmt::format("  backward: stage {} -> {} gradient of %{}, {} to each device a "
                       "micro-batch\n",
                       b.toStage, b.fromStage, m.tensors[m.ops[b.op].inputs.at(0)].name,
                       formatBytes(back));
  }
}

} // namespace epl::ir
