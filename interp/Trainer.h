// `epl run` on every rank: the training loop around an Executor. Data, learning rate,
// evaluation, checkpoints, progress and metrics; the summary at the end.
#pragma once
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <ostream>
#include <string>

namespace epl::backend {
class Comm;
}

namespace epl::interp {

struct RunOptions {
  std::string script;          // as given on the command line: how to resume is said with it
  std::string version;         // of epl, for the metrics file's run header
  std::string baseDir;         // the script's folder: relative paths in the script resolve here
  std::string metricsPath;     // JSON lines; empty for none
  std::string tensorboardDir;  // TensorBoard event files' folder (TensorBoardLog.h); empty: none
  std::string tracePath;       // Chrome trace of the first steps (Trace.h); empty for none
  bool resume = false;         // continue from the newest checkpoint in train.checkpoint's dir
  bool saveInitial = false;    // write a checkpoint of the initial weights (step 0)
  int threads = 0;             // CPU threads; 0: every core
  std::string device = "auto"; // auto, cpu or cuda (DeviceChoice.h)
  std::string offloadDir;      // `offload_to = disk`'s folder; empty: the temporary folder
  // The cluster whose prediction the run's step time is compared with (ir::loadCluster's
  // names); empty: on the CPU `here` when this machine is calibrated, on a GPU the built-in
  // cluster of its kind (ir::builtinClusterForGpu).
  std::string cluster;
  int64_t stopAfter = 0; // stop after this step (a checkpoint is written) as if
                         // interrupted; the schedule still spans `steps`. 0: run them all
  std::ostream* out = nullptr;
  bool terminal = false; // draw a progress bar instead of log lines
  // The ranks of the job, each running train() on its share of the batch; nullptr: this
  // process alone. Rank 0 prints; the others only with logAll, each line after its rank.
  backend::Comm* comm = nullptr;
  bool logAll = false;
};

// Warns about each policy the runtime does not apply yet (amp, recompute, offload, zero), so
// a run never silently differs from what the script says.
void warnUnappliedPolicies(const ir::Module& m, Diagnostics& diags);

// Whether the runtime runs this plan: one device, data parallelism, or a pipeline of
// one-device stages (a split, larger stage groups and data parallelism over pipelines are
// not run yet). Says why not in `diags`.
bool checkRunnable(const ir::Module& m, Diagnostics& diags);

// Trains the planned module. Problems (data, checkpoints, a NaN loss) are reported to
// `diags`; returns the process exit code: 0, 1 for an error, or, when a signal stopped the
// run (StopSignals.h), 128 + the signal (0 for SIGUSR1, a request to stop).
int train(const ir::Module& m, const RunOptions& options, Diagnostics& diags);

struct SampleOptions {
  std::string baseDir;
  std::string checkpoint; // folder of one checkpoint, or a checkpoint dir (newest is used)
  std::string prompt;
  int64_t length = 200;
  double temperature = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "auto";
  std::ostream* out = nullptr;
};

// Generates text from a trained byte-level model (planned with batch 1).
int sample(const ir::Module& m, const SampleOptions& options, Diagnostics& diags);

} // namespace epl::interp
