// `epl run --tensorboard DIR`: the run's numbers as TensorBoard event files, the format
// dashboards read, beside the metrics file (Progress.h).
#pragma once
#include "interp/Progress.h"

#include <cstdint>
#include <optional>
#include <string>

namespace epl::interp {

// Writes one new event file per run into a folder, `events.out.tfevents.<unix
// seconds>.<hostname>`; a resumed run starts another one beside the first, and TensorBoard
// reads the folder's files as one run. Each step's numbers of the metrics file's step line
// are scalars under the same names in `train/` (`train/loss`, `train/lr`,
// `train/samples_per_s`, …); an evaluation's are `eval/loss` and `eval/accuracy`, the one
// after the last step's `eval_final/…`. The step is the steps done, as in the metrics
// file. Each step's events are written at once (a dashboard shows them live) but not
// synced to the disk. Not opened, it writes nothing; a write that fails closes it, the run
// goes on, and failure() says why once.
class TensorBoardLog {
public:
  TensorBoardLog() = default;
  TensorBoardLog(const TensorBoardLog&) = delete;
  TensorBoardLog& operator=(const TensorBoardLog&) = delete;
  ~TensorBoardLog();

  struct Problem {
    std::string message, help;
  };
  // Creates `folder` (and its parents) when missing and a new, empty event file in it, so
  // that a folder that cannot be written is found before the first step.
  std::optional<Problem> open(const std::string& folder);
  // The file's first events: its version, and that the run starts at `firstStep` (1, or
  // the step after a resumed checkpoint's): TensorBoard forgets what earlier files in the
  // folder hold from there on, the steps a resumed run does again (and all of an earlier
  // run's for a fresh one, as the metrics file is emptied).
  void start(int64_t firstStep);
  void step(const StepReport& r);
  // `final`: the evaluation after the last step (else a periodic one). A negative
  // `accuracy` (a loss that is not `cross_entropy`) is left out.
  void eval(int64_t step, double loss, double accuracy, bool final);
  // The message of the write that failed, the first time it is asked for.
  std::optional<std::string> failure();
  const std::string& path() const { return path_; }

private:
  void write(const std::string& event);
  int fd_ = -1;
  std::string path_, failure_;
  bool failureTaken_ = false;
};

} // namespace epl::interp
