// `epl run --trace`: each rank records when every instruction of the first training steps
// ran; rank 0 gathers every rank's events and writes one Chrome trace (Perfetto opens it)
// and a picture of the last traced step, and measures the pipeline bubble from them.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace epl::backend {
class Comm;
}

namespace epl::interp {

enum class Track { Compute, Communication }; // the trace's thread ids 0 and 1

struct TraceEvent {
  std::string name; // "fwd matmul_3", "send %h mb 2 -> rank 1", …
  int64_t step = 0; // 0-based
  int micro = 0;
  Track track = Track::Compute;
  double startUs = 0, endUs = 0; // since the recorder's origin
};

// One step's instructions, first to last: the wall time the bubble is measured against.
struct TraceStep {
  int64_t step = 0;
  double startUs = 0, endUs = 0;
};

// One rank's events. Only the first kMaxSteps steps are kept, so a long run's trace does
// not grow without bound.
class TraceRecorder {
public:
  static constexpr int kMaxSteps = 20;
  TraceRecorder() : origin_(std::chrono::steady_clock::now()) {}
  // The run's start: every rank calls it right after a barrier, so their clocks agree.
  void restart() { origin_ = std::chrono::steady_clock::now(); }
  double nowUs() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
        .count();
  }
  bool wants() const { return steps_.size() < static_cast<size_t>(kMaxSteps); }
  // The step's batch, read from the data into the host's staging before the executor runs
  // the step's instructions (`read`): work of the step, whose window then starts with it.
  void readBatch(int64_t step, double startUs, double endUs) {
    events_.push_back({"read", step, 0, Track::Compute, startUs, endUs});
    readStep_ = step;
    readStartUs_ = startUs;
  }
  void beginStep(int64_t step) {
    steps_.push_back({step, readStep_ == step ? readStartUs_ : nowUs(), 0});
  }
  void endStep() { steps_.back().endUs = nowUs(); }
  void add(TraceEvent e) { events_.push_back(std::move(e)); }
  const std::vector<TraceEvent>& events() const { return events_; }
  const std::vector<TraceStep>& steps() const { return steps_; }

private:
  std::chrono::steady_clock::time_point origin_;
  std::vector<TraceStep> steps_;
  std::vector<TraceEvent> events_;
  int64_t readStep_ = -1;
  double readStartUs_ = 0;
};

// Every rank's recorder and stage, on rank 0 after gatherTraces.
struct RankTrace {
  int stage = 0;
  std::vector<TraceStep> steps;
  std::vector<TraceEvent> events;
};

// Collective: every rank's events reach rank 0, which gets them in rank order (the other
// ranks get an empty list).
std::vector<RankTrace> gatherTraces(const TraceRecorder& mine, int stage, backend::Comm& comm);

// Chrome's trace event format: one process per rank ("rank R (stage S)"), threads "compute"
// and "communication". Returns the error text when the file cannot be written.
std::optional<std::string> writeChromeTrace(const std::string& path,
                                            const std::vector<RankTrace>& ranks);

// The last traced step as a picture beside the trace (`t.json` gives `t.svg`): a row a
// rank and track, each instruction a box with its name and time as a tooltip. Returns the
// path written, or the error text.
std::string traceSvgPath(const std::string& tracePath);
std::optional<std::string> writeTraceSvg(const std::string& path,
                                         const std::vector<RankTrace>& ranks);
// 1 - (every rank's time in compute instructions) / (ranks x the step's window, from the
// first rank's start to the last rank's end), averaged over the traced steps; and how many
// steps that is.
double measuredBubble(const std::vector<RankTrace>& ranks, int* steps);

} // namespace epl::interp
