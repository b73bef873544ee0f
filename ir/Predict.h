// The predicted step of a plan on a cluster (ir/Cluster.h): each rank's instruction stream
// costed op by op, the collectives by the ring's formulas, a pipeline by its schedule.
// docs/cluster.md gives the model and what it leaves out.
#pragma once
#include "ir/Cluster.h"
#include "ir/Module.h"

#include <ostream>
#include <string>
#include <vector>

namespace epl::ir {

struct Prediction {
  std::string cluster, device; // device: its kinds and counts on a mixed cluster
  double stepSeconds = 0;
  // The parts of a step. Compute: the busiest rank's forward and backward ops (its
  // recomputations included), all micro-batches; with a pipeline, per stage. The bubble:
  // what the schedule leaves idle on the busiest stage. The gradient reduction in all and
  // the part the backward does not hide; the split regions' collectives; transfers
  // between stages; the optimizer.
  double compute = 0;
  std::vector<double> stageCompute; // a pipeline's stages, a micro-batch each
  double bubble = 0;
  // A pipeline whose ranks share a calibrated machine's cores (Cluster::coreShare): its
  // bubble shrinks by the share, the ranks that run in the warm-up and cool-down getting a
  // whole core.
  bool sharedCores = false;
  double gradientReduction = 0, exposedReduction = 0;
  double splitCommunication = 0;
  double stageTransfers = 0;
  double optimizer = 0;
  // Offloaded states (Program::offloadedBytes; on disk, or in host memory): the bytes a rank
  // reads and writes a step (the optimizer's stream of its states, and with `offload =
  // params` its gathers' parts of the parameters), their seconds over its share of the
  // node's disks or, on a device whose memory is not the host's, over the host link where
  // that is slower (the staging buffers pipeline the two; in host memory the link alone),
  // and what the update (for the stream) and the compute (for the gathers' read-ahead) do
  // not hide. The rank that exposes the most.
  // diskCosted: false where the cluster gives no disk bandwidth (the disks' part is then
  // left out of the seconds).
  double offloadBytes = 0, offload = 0, exposedOffload = 0;
  bool diskCosted = true;
  double samplesPerSecond = 0, tokensPerSecond = 0;
  // Hardware FLOP/s per device (every rank's matrix products, recomputation included,
  // over np devices) and MFU (the model's FLOPs only, over np peaks).
  double tflopsPerDevice = 0, mfu = 0;
  // The memory plan of the rank that leaves the least room on its device, and that
  // device's memory (on one kind of device: the largest rank's plan).
  double peakBytes = 0, deviceBytes = 0;
  std::string memoryDevice; // that device's name
  // The busiest rank's compute ops (the `compute` part), each named as `epl run --trace`
  // names its instructions (Module::runName), in the order of their first run: the step's
  // seconds, hardware FLOPs and runs of each. opsRank: the first rank of that program.
  struct OpCost {
    std::string name;
    double seconds = 0, flops = 0;
    int runs = 0;
  };
  std::vector<OpCost> ops;
  int opsRank = 0;
};

// Requires a plan with rank programs (Module::programs) and a train block. `ops`: fill
// Prediction::ops too (the search, which predicts hundreds of plans, leaves them out).
Prediction predict(const Module& m, const Cluster& c, bool ops = false);

// The memory part of the prediction alone (cluster, device, peakBytes, deviceBytes,
// memoryDevice), as predict() fills it; no costs: the search's plans that do not fit.
Prediction predictMemory(const Module& m, const Cluster& c);

// Whether program p's memory plan holds more than a device its ranks sit on (the plan
// does not fit, as predictMemory finds); a device of unknown memory holds any.
bool overMemory(const Module& m, const Program& p, const Cluster& c);

// The predicted section of `epl plan --cluster`.
void printPrediction(const Module& m, const Prediction& p, std::ostream& out);

// A ring's time for `bytes` over n ranks: an all-reduce sends 2 (n - 1) / n of them from
// each rank in 2 (n - 1) hops, a reduce-scatter or an all-gather (n - 1) / n in n - 1.
double ringAllReduceSeconds(double bytes, int n, const Link& link);
double ringHalfSeconds(double bytes, int n, const Link& link);

} // namespace epl::ir
