// What a run shows while it trains: a one-line progress bar redrawn in place on a
// terminal (step, loss, samples/s, ETA), plain log lines every `log_every` steps when the
// output is a file or a pipe; and every logged step as a JSON line for plotting.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace epl::interp {

struct StepReport {
  int64_t step = 0; // 1-based: steps done
  int64_t steps = 0;
  int64_t firstStep = 0; // steps done before this run started (a resumed run's checkpoint)
  double loss = 0, lr = 0;
  double gradNorm = -1; // measured when clipping or under fp16; -1 otherwise, and left out
  double samplesPerSecond = 0;
  double elapsedSeconds = 0;
  double stepSeconds = 0;  // this step alone: data, forward, backward, optimizer
  int64_t memoryBytes = 0; // resident set of the process
  // Data parallelism: seconds rank 0 spent blocked on gradient reductions; seconds from the
  // last rank's first reduction start to the last rank's last wait (StepResult); and the
  // gradient bytes each rank reduced (0 on one device).
  double reduceWaitSeconds = 0, reduceSpanSeconds = 0;
  int64_t reduceBytes = 0;
  // A model with moe: the load-balancing loss (mean over layers and samples) and the share
  // of token copies the capacity dropped; -1 without moe, and left out.
  double moeAux = -1, moeDropped = -1;
  // amp = fp16: the loss scale the step used (0 without one, and left out), and whether its
  // gradients overflowed, so that it updated nothing.
  double lossScale = 0;
  bool skipped = false;
  // Token data: tokens of the step's samples per second; 0 otherwise, and left out.
  double tokensPerSecond = 0;
};

class Progress {
public:
  Progress(std::ostream& out, bool terminal, int64_t logEvery)
      : out_(out), terminal_(terminal), logEvery_(logEvery) {}
  void step(const StepReport& r);
  // An evaluation's progress (`done` of `total` samples), redrawn on a terminal only.
  void evaluating(int64_t done, int64_t total);
  // A line that must not be overwritten by the bar (evaluation, checkpoint).
  void line(const std::string& text);
  void finish();

private:
  std::ostream& out_;
  bool terminal_;
  int64_t logEvery_;
  bool barShown_ = false;
  double lastDraw_ = -1;
  std::optional<std::chrono::steady_clock::time_point> lastEval_;
};

// Appends JSON lines: a header per run ({"run": {script, its hash, epl's version, -np, the
// settings, "resumed_at_step" when resumed}}), {"step":…, "time":…, "loss":…, "lr":…,
// "samples_per_s":…, "step_seconds":…, "memory_bytes":…} per step (with "tokens_per_s" for
// token data, "grad_norm" when clipping, "reduce_wait_seconds",
// "reduce_span_seconds" and "reduce_bytes" under data parallelism, "moe_aux_loss" and
// "moe_dropped" with moe layers), {"step":…, "eval_loss":…,
// "eval_accuracy":…, "eval_final":…} per evaluation (final: the one after the last step). Not
// opened, it writes nothing. A write that fails (a full disk) closes it: the run goes on, and
// failure() says why once.
class MetricsFile {
public:
  MetricsFile() = default;
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  ~MetricsFile();

  struct Problem {
    std::string message, help;
  };
  // Opens `path` for appending, creating it, so that a path that cannot be written is found
  // before the first step; a fresh run then calls startAfresh().
  std::optional<Problem> open(const std::string& path);
  void startAfresh(); // empties the file (a resumed run appends)
  // The first line of a run (a resumed run's marks where it resumed): {"run": {…}}.
  void header(const std::string& json);
  void step(const StepReport& r);
  // `final`: the evaluation after the last step (else a periodic one).
  void eval(int64_t step, double loss, double accuracy, int64_t samples, bool final);
  // The message of the write that failed, the first time it is asked for.
  std::optional<std::string> failure();
  // Whether a write failed (the file is missing lines).
  bool failed() const { return !failure_.empty(); }

private:
  void write(const std::string& text);
  void fail(int err);
  int fd_ = -1;
  std::string path_, failure_;
  bool failureTaken_ = false;
};

// The loss curves of the metrics file at `metricsPath` as SVG beside it (`x.metrics.jsonl`
// gives `x.loss.svg`): the training loss by step and the validation loss where it was
// evaluated, over every run the file records (a step a resumed run repeated counts once,
// its last value). Returns the path written; on failure (the metrics are not a regular
// file, such as a device, or the picture cannot be written), throws std::runtime_error.
std::string writeLossCurves(const std::string& metricsPath);

// The resident set size of this process now, and its peak (VmHWM), in bytes.
int64_t residentBytes();
int64_t peakResidentBytes();
// The part of the resident set that is pages of files (RssFile: code, libraries, mapped
// data), which the kernel can drop and read back; memory the run allocates is not among
// them.
int64_t fileResidentBytes();
// Restarts the peak from the resident set now (Linux's /proc/self/clear_refs), so that a
// later peakResidentBytes() is that of what came after. False where the kernel refuses:
// the peak then stays the process's.
bool restartPeakResident();

std::string formatDuration(double seconds);

} // namespace epl::interp
