// The progress bar, log lines and the metrics file.
#include "interp/Progress.h"

#include "support/Files.h"
#include "support/Svg.h"
#include "support/Text.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace epl::interp {

namespace {

int64_t statusField(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size())) * 1024;
  return 0;
}

// A rate for people: whole numbers when large, never a false 0 when small.
std::string rate(double v) {
  return v >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.3g}", v);
}

std::string bar(int64_t done, int64_t total, int width) {
  int full = total > 0 ? static_cast<int>(width * done / total) : width;
  return std::string(full, '=') + (full < width ? ">" : "") +
         std::string(std::max(0, width - full - 1), ' ');
}

} // namespace

std::string writeLossCurves(const std::string& metricsPath) {
  // A device (`/dev/full`, a pipe) would read without end: regular files only.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(metricsPath, ec))
    throw std::runtime_error(fmt::format("`{}` is not a regular file", metricsPath));
  std::ifstream in(metricsPath);
  if (!in) throw std::runtime_error(fmt::format("cannot read `{}`", metricsPath));
  std::map<double, double> loss, validation;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) continue;
    double step = j["step"].get<double>();
    if (j.contains("loss") && j["loss"].is_number()) loss[step] = j["loss"].get<double>();
    if (j.contains("eval_loss") && j["eval_loss"].is_number())
      validation[step] = j["eval_loss"].get<double>();
  }
  const std::string suffix = ".metrics.jsonl";
  std::string path =
      metricsPath.size() > suffix.size() &&
              metricsPath.compare(metricsPath.size() - suffix.size(), suffix.size(), suffix) == 0
          ? metricsPath.substr(0, metricsPath.size() - suffix.size()) + ".loss.svg"
          : metricsPath + ".loss.svg";
  std::string svg =
      lineChart(fmt::format("loss by step ({})", metricsPath), "step",
                {{"training loss", "#4e79a7", {loss.begin(), loss.end()}, false},
                 {"validation loss", "#e15759", {validation.begin(), validation.end()}, true}});
  std::ofstream out(path, std::ios::binary);
  out << svg;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write `{}`", path));
  return path;
}

// From /proc/self/statm (its second field, in pages): the same figure as VmRSS, which a
// step reads for its metrics; /proc/self/status takes the kernel tens of microseconds to
// write, a tenth of a small model's step.
int64_t residentBytes() {
  int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return statusField("VmRSS:");
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  long long size = 0, pages = 0;
  if (n <= 0) return statusField("VmRSS:");
  buf[n] = 0;
  if (std::sscanf(buf, "%lld %lld", &size, &pages) != 2) return statusField("VmRSS:");
  return static_cast<int64_t>(pages) * ::sysconf(_SC_PAGESIZE);
}
int64_t peakResidentBytes() {
  return statusField("VmHWM:");
}
int64_t fileResidentBytes() {
  return statusField("RssFile:");
}
bool restartPeakResident() {
  int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool done = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return done;
}

std::string formatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void Progress::step(const StepReport& r) {
  if (r.skipped)
    line(fmt::format("step {}: the gradients overflowed at loss scale {:g}: step skipped, the "
                     "scale is now {:g}",
                     r.step, r.lossScale, r.lossScale / 2));
  // The pace of this run: a resumed run's elapsed time covers only its own steps.
  int64_t done = r.step - r.firstStep;
  double eta = done > 0 ? r.elapsedSeconds / static_cast<double>(done) * (r.steps - r.step) : 0;
  if (terminal_) {
    // Redraw at most ten times a second, and always on the last step.
    if (r.step != r.steps && r.elapsedSeconds - lastDraw_ < 0.1) return;
    lastDraw_ = r.elapsedSeconds;
    out_ << fmt::format("\r\x1b[Kstep {}/{} [{}] loss {:.4f} | {} samples/s | ETA {}", r.step,
                        r.steps, bar(r.step, r.steps, 24), r.loss, rate(r.samplesPerSecond),
                        formatDuration(eta))
         << std::flush;
    barShown_ = true;
    return;
  }
  if (r.step % logEvery_ != 0 && r.step != r.steps && r.step != 1) return;
  // The gradient norm is measured only when clipping or fp16 needs it: never a false 0.
  std::string norm = r.gradNorm < 0 ? "" : fmt::format("  grad_norm {:.3g}", r.gradNorm);
  if (r.moeAux >= 0)
    norm += fmt::format("  moe_aux {:.3f}  dropped {:.1f}%", r.moeAux, 100 * r.moeDropped);
  out_ << fmt::format("step {}/{}  loss {:.4f}  lr {:.3g}{}  {} samples/s  ETA {}\n", r.step,
                      r.steps, r.loss, r.lr, norm, rate(r.samplesPerSecond), formatDuration(eta))
       << std::flush;
}

void Progress::evaluating(int64_t done, int64_t total) {
  if (!terminal_ || total <= 0) return;
  auto now = std::chrono::steady_clock::now();
  if (lastEval_ && now - *lastEval_ < std::chrono::milliseconds(100)) return;
  lastEval_ = now;
  out_ << fmt::format("\r\x1b[Kvalidation [{}] {}%", bar(done, total, 24), 100 * done / total)
       << std::flush;
  barShown_ = true;
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

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<MetricsFile::Problem> MetricsFile::open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ >= 0) return std::nullopt;
  int err = errno;
  std::string what = fmt::format("cannot write the metrics file `{}`", path);
  if (err == EISDIR) return Problem{what + ": it is a folder", "pass --metrics a file's path"};
  return Problem{fmt::format("{}: {}", what, errorText(err)),
                 err == ENOENT ? "create its folder, or pass --metrics another path"
                               : "pass --metrics another path"};
}

namespace {

// Wall-clock seconds since the epoch, to the millisecond: when a line was written.
double unixSeconds() {
  using namespace std::chrono;
  return static_cast<double>(
             duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count()) /
         1000.0;
}

} // namespace

void MetricsFile::header(const std::string& json) {
  if (fd_ >= 0) write(json + "\n");
}

void MetricsFile::startAfresh() {
  struct stat st {};
  // Only a file is emptied: a path such as /dev/stdout or a pipe is written as it is.
  if (fd_ >= 0 && ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && ::ftruncate(fd_, 0) != 0)
    fail(errno);
}

void MetricsFile::write(const std::string& text) {
  if (fd_ < 0) return;
  if (int err = writeAll(fd_, text)) fail(err);
}

void MetricsFile::fail(int err) {
  failure_ = fmt::format("cannot write the metrics file `{}`: {}", path_, errorText(err));
  ::close(fd_);
  fd_ = -1;
}

std::optional<std::string> MetricsFile::failure() {
  if (failure_.empty() || failureTaken_) return std::nullopt;
  failureTaken_ = true;
  return failure_;
}

void MetricsFile::step(const StepReport& r) {
  if (fd_ < 0) return;
  nlohmann::json j{{"step", r.step},
                   {"time", unixSeconds()},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"samples_per_s", r.samplesPerSecond},
                   {"step_seconds", r.stepSeconds},
                   {"memory_bytes", r.memoryBytes}};
  if (r.tokensPerSecond > 0) j["tokens_per_s"] = r.tokensPerSecond;
  if (r.gradNorm >= 0 && std::isfinite(r.gradNorm)) j["grad_norm"] = r.gradNorm;
  if (r.lossScale > 0) j["loss_scale"] = r.lossScale;
  if (r.skipped) j["skipped"] = true;
  if (r.moeAux >= 0) {
    j["moe_aux_loss"] = r.moeAux;
    j["moe_dropped"] = r.moeDropped;
  }
  if (r.reduceBytes > 0) {
    j["reduce_wait_seconds"] = r.reduceWaitSeconds;
    j["reduce_span_seconds"] = r.reduceSpanSeconds;
    j["reduce_bytes"] = r.reduceBytes;
  }
  write(j.dump() + "\n");
}

void MetricsFile::eval(int64_t step, double loss, double accuracy, int64_t samples, bool final) {
  if (fd_ < 0) return;
  nlohmann::json j{{"step", step},
                   {"time", unixSeconds()},
                   {"eval_loss", loss},
                   {"eval_samples", samples},
                   {"eval_final", final}};
  if (accuracy >= 0) j["eval_accuracy"] = accuracy;
  write(j.dump() + "\n");
}

} // namespace epl::interp
