// The progress bar, log lines and the metrics file.
#include "interp/Progress.h"

#include "support/Text.h"

#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>

namespace epl::interp {

namespace {

int64_t statusField(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size())) * 1024;
  return 0;
}

std::string bar(int64_t done, int64_t total, int width) {
  int full = total > 0 ? static_cast<int>(width * done / total) : width;
  return std::string(full, '=') + (full < width ? ">" : "") +
         std::string(std::max(0, width - full - 1), ' ');
}

} // namespace

int64_t residentBytes() {
  return statusField("VmRSS:");
}
int64_t peakResidentBytes() {
  return statusField("VmHWM:");
}

std::string formatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void Progress::step(const StepReport& r) {
  // The pace of this run: a resumed run's elapsed time covers only its own steps.
  int64_t done = r.step - r.firstStep;
  double eta = done > 0 ? r.elapsedSeconds / static_cast<double>(done) * (r.steps - r.step) : 0;
  if (terminal_) {
    // Redraw at most ten times a second, and always on the last step.
    if (r.step != r.steps && r.elapsedSeconds - lastDraw_ < 0.1) return;
    lastDraw_ = r.elapsedSeconds;
    out_ << fmt::format("\r\x1b[Kstep {}/{} [{}] loss {:.4f} | {:.0f} samples/s | ETA {}", r.step,
                        r.steps, bar(r.step, r.steps, 24), r.loss, r.samplesPerSecond,
                        formatDuration(eta))
         << std::flush;
    barShown_ = true;
    return;
  }
  if (r.step % logEvery_ != 0 && r.step != r.steps && r.step != 1) return;
  out_ << fmt::format("step {}/{}  loss {:.4f}  lr {:.3g}  grad_norm {:.3g}  {:.0f} samples/s  "
                      "ETA {}\n",
                      r.step, r.steps, r.loss, r.lr, r.gradNorm, r.samplesPerSecond,
                      formatDuration(eta))
       << std::flush;
}

void Progress::line(const std::string& text) {
  if (barShown_) out_ << "\r\x1b[K";
  out_ << text << "\n";
  barShown_ = false;
  lastDraw_ = -1;
  out_ << std::flush;
}

void Progress::finish() {
  if (barShown_) out_ << "\n";
  barShown_ = false;
}

MetricsFile::MetricsFile(const std::string& path, bool append) {
  if (!path.empty()) out_.open(path, append ? std::ios::app : std::ios::trunc);
}

void MetricsFile::step(const StepReport& r) {
  if (!out_.is_open()) return;
  nlohmann::json j{{"step", r.step},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"grad_norm", r.gradNorm},
                   {"samples_per_s", r.samplesPerSecond},
                   {"step_seconds", r.stepSeconds},
                   {"memory_bytes", r.memoryBytes}};
  if (r.reduceBytes > 0) {
    j["reduce_wait_seconds"] = r.reduceWaitSeconds;
    j["reduce_span_seconds"] = r.reduceSpanSeconds;
    j["reduce_bytes"] = r.reduceBytes;
  }
  out_ << j.dump() << "\n" << std::flush;
}

void MetricsFile::eval(int64_t step, double loss, double accuracy, int64_t samples) {
  if (!out_.is_open()) return;
  nlohmann::json j{{"step", step}, {"eval_loss", loss}, {"eval_samples", samples}};
  if (accuracy >= 0) j["eval_accuracy"] = accuracy;
  out_ << j.dump() << "\n" << std::flush;
}

} // namespace epl::interp
