// The run's numbers as TensorBoard scalars: what they are called and when they are written.
// The bytes are support/EventFile's.
#include "interp/TensorBoardLog.h"

#include "support/EventFile.h"
#include "support/Files.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <fcntl.h>
#include <filesystem>
#include <fmt/format.h>
#include <unistd.h>
#include <vector>

namespace epl::interp {

namespace {

// Wall-clock seconds since the epoch, to the microsecond, as TensorBoard's wall_time.
double eventWallTime() {
  using namespace std::chrono;
  return static_cast<double>(
             duration_cast<microseconds>(system_clock::now().time_since_epoch()).count()) /
         1e6;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == 0) return "localhost";
  return name;
}

// The numbers of the metrics file's step line (MetricsFile::step), under the same names;
// the bool `skipped` is not a number to chart and stays out.
std::vector<Scalar> stepScalars(const StepReport& r) {
  std::vector<Scalar> s;
  auto add = [&](const char* name, double v) {
    s.push_back({fmt::format("train/{}", name), static_cast<float>(v)});
  };
  add("loss", r.loss);
  add("lr", r.lr);
  add("samples_per_s", r.samplesPerSecond);
  add("step_seconds", r.stepSeconds);
  add("memory_bytes", static_cast<double>(r.memoryBytes));
  if (r.tokensPerSecond > 0) add("tokens_per_s", r.tokensPerSecond);
  if (r.gradNorm >= 0 && std::isfinite(r.gradNorm)) add("grad_norm", r.gradNorm);
  if (r.lossScale > 0) add("loss_scale", r.lossScale);
  if (r.moeAux >= 0) {
    add("moe_aux_loss", r.moeAux);
    add("moe_dropped", r.moeDropped);
  }
  if (r.reduceBytes > 0) {
    add("reduce_wait_seconds", r.reduceWaitSeconds);
    add("reduce_span_seconds", r.reduceSpanSeconds);
    add("reduce_bytes", static_cast<double>(r.reduceBytes));
  }
  return s;
}

} // namespace

TensorBoardLog::~TensorBoardLog() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<TensorBoardLog::Problem> TensorBoardLog::open(const std::string& folder) {
  std::string what = fmt::format("cannot write TensorBoard events into `{}`", folder);
  std::string help = "pass --tensorboard another folder";
  FileKind kind = fileKind(folder);
  if (kind == FileKind::Regular || kind == FileKind::Other)
    return Problem{what + ": it is not a folder", help};
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return Problem{fmt::format("{}: {}", what, errorText(ec.value())), help};
  // Another run's file of the same second and machine is never overwritten: a suffix
  // keeps the name's order, which is the order TensorBoard reads the folder in.
  std::string name =
      fmt::format("events.out.tfevents.{}.{}", static_cast<int64_t>(eventWallTime()), hostName());
  for (int n = 0; fd_ < 0; ++n) {
    path_ = (std::filesystem::path(folder) / name).string() + (n ? fmt::format(".{}", n) : "");
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || n == 1000))
      return Problem{fmt::format("{}: {}", what, errorText(errno)), help};
  }
  return std::nullopt;
}

void TensorBoardLog::start(int64_t firstStep) {
  double now = eventWallTime();
  write(tfRecord(fileVersionEvent(now)) + tfRecord(sessionStartEvent(now, firstStep)));
}

void TensorBoardLog::step(const StepReport& r) {
  if (fd_ >= 0) write(tfRecord(scalarsEvent(eventWallTime(), r.step, stepScalars(r))));
}

void TensorBoardLog::eval(int64_t step, double loss, double accuracy, bool final) {
  if (fd_ < 0) return;
  std::string group = final ? "eval_final" : "eval";
  std::vector<Scalar> s{{group + "/loss", static_cast<float>(loss)}};
  if (accuracy >= 0) s.push_back({group + "/accuracy", static_cast<float>(accuracy)});
  write(tfRecord(scalarsEvent(eventWallTime(), step, s)));
}

// One write(2) a step: the step's events reach the file, and a reader, together.
void TensorBoardLog::write(const std::string& records) {
  if (fd_ < 0) return;
  int err = writeAll(fd_, records);
  if (err == 0) return;
  failure_ = fmt::format("cannot write the TensorBoard events `{}`: {}", path_, errorText(err));
  ::close(fd_);
  fd_ = -1;
}

std::optional<std::string> TensorBoardLog::failure() {
  if (failure_.empty() || failureTaken_) return std::nullopt;
  failureTaken_ = true;
  return failure_;
}

} // namespace epl::interp
