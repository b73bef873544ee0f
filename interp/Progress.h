// What a run shows while it trains: a one-line progress bar redrawn in place on a
// terminal (step, loss, samples/s, ETA), plain log lines every `log_every` steps when the
// output is a file or a pipe; and every logged step as a JSON line for plotting.
#pragma once
#include <cstdint>
#include <fstream>
#include <ostream>
#include <string>

namespace epl::interp {

struct StepReport {
  int64_t step = 0; // 1-based: steps done
  int64_t steps = 0;
  int64_t firstStep = 0; // steps done before this run started (a resumed run's checkpoint)
  double loss = 0, lr = 0, gradNorm = 0;
  double samplesPerSecond = 0;
  double elapsedSeconds = 0;
  double stepSeconds = 0;  // this step alone: data, forward, backward, optimizer
  int64_t memoryBytes = 0; // resident set of the process
  // Data parallelism: seconds rank 0 spent blocked on gradient reductions; seconds from the
  // last rank's first reduction start to the last rank's last wait (StepResult); and the
  // gradient bytes each rank reduced (0 on one device).
  double reduceWaitSeconds = 0, reduceSpanSeconds = 0;
  int64_t reduceBytes = 0;
};

class Progress {
public:
  Progress(std::ostream& out, bool terminal, int64_t logEvery)
      : out_(out), terminal_(terminal), logEvery_(logEvery) {}
  void step(const StepReport& r);
  // A line that must not be overwritten by the bar (evaluation, checkpoint).
  void line(const std::string& text);
  void finish();

private:
  std::ostream& out_;
  bool terminal_;
  int64_t logEvery_;
  bool barShown_ = false;
  double lastDraw_ = -1;
};

// Appends JSON lines: {"step":…, "loss":…, "lr":…, "grad_norm":…, "samples_per_s":…,
// "step_seconds":…, "memory_bytes":…} per step (with "reduce_wait_seconds",
// "reduce_span_seconds" and "reduce_bytes" under data parallelism), {"step":…, "eval_loss":…,
// "eval_accuracy":…} per evaluation. An empty path writes nothing.
class MetricsFile {
public:
  explicit MetricsFile(const std::string& path, bool append);
  void step(const StepReport& r);
  void eval(int64_t step, double loss, double accuracy, int64_t samples);

private:
  std::ofstream out_;
};

// The resident set size of this process now, and its peak (VmHWM), in bytes.
int64_t residentBytes();
int64_t peakResidentBytes();

std::string formatDuration(double seconds);

} // namespace epl::interp
