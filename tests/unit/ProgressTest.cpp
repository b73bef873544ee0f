// What a run shows while it trains: the ETA of a resumed run, from the steps done since it
// started rather than since step 0.
#include "interp/Progress.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <unistd.h>

using namespace epl::interp;
using Catch::Matchers::Contains;

namespace {

// The log line of one step of 2000 in a run that started at `firstStep` and has taken
// `elapsed` seconds so far.
std::string logLine(int64_t firstStep, int64_t step, double elapsed) {
  std::ostringstream out;
  Progress progress(out, false, 1);
  StepReport r;
  r.step = step;
  r.steps = 2000;
  r.firstStep = firstStep;
  r.elapsedSeconds = elapsed;
  progress.step(r);
  return out.str();
}

} // namespace

TEST_CASE("the ETA counts the steps of this run", "[progress]") {
  // 2 s a step: 999 steps to go take 1998 s, whether the run started at 0 or resumed.
  CHECK_THAT(logLine(0, 1001, 2002), Contains("ETA 33m18s"));
  CHECK_THAT(logLine(1000, 1001, 2), Contains("ETA 33m18s"));
  CHECK_THAT(logLine(1000, 1010, 20), Contains("ETA 33m00s"));
}

// The measured memory of a step is the peak above what the process held before the run's
// buffers: a higher peak before them (a data set inflating) must not count.
TEST_CASE("the resident peak restarts from the resident set", "[progress]") {
  constexpr size_t kBytes = size_t{64} << 20;
  // Mapped and unmapped directly: a sanitizer's allocator would keep freed memory.
  void* transient =
      mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(transient != MAP_FAILED);
  std::memset(transient, 1, kBytes); // touched: resident
  munmap(transient, kBytes);
  int64_t before = epl::interp::peakResidentBytes();
  REQUIRE(before - epl::interp::residentBytes() >= static_cast<int64_t>(kBytes) / 2);
  REQUIRE(epl::interp::restartPeakResident());
  int64_t after = epl::interp::peakResidentBytes();
  CHECK(after < before - static_cast<int64_t>(kBytes) / 2);
  CHECK(after >= epl::interp::residentBytes() - (int64_t{1} << 20));
}

// The measured memory of a step leaves out the pages of files read in meanwhile (the code
// its kernels run): a file's pages count there, and memory the run allocates does not.
TEST_CASE("the pages of files are told from the memory the run allocates", "[progress]") {
  constexpr size_t kBytes = size_t{16} << 20;
  // In the working folder, on a disk: a file on tmpfs counts as shared memory instead.
  char path[] = "epl-progress-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  unlink(path);
  REQUIRE(ftruncate(fd, static_cast<off_t>(kBytes)) == 0);
  void* file = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(file != MAP_FAILED);
  int64_t before = fileResidentBytes();
  std::memset(file, 1, kBytes); // the file's pages come in
  CHECK(fileResidentBytes() - before >= static_cast<int64_t>(kBytes) / 2);
  munmap(file, kBytes);
  close(fd);

  void* anonymous =
      mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(anonymous != MAP_FAILED);
  before = fileResidentBytes();
  int64_t resident = residentBytes();
  std::memset(anonymous, 1, kBytes);
  CHECK(residentBytes() - resident >= static_cast<int64_t>(kBytes) / 2);
  CHECK(fileResidentBytes() - before < static_cast<int64_t>(kBytes) / 4);
  munmap(anonymous, kBytes);
}

// The loss curves drawn from a metrics file: a resumed run's repeated steps count once (the
// last value), evaluations are dots, and the picture lands beside the file.
TEST_CASE("the loss curves of a metrics file are drawn beside it") {
  char dir[] = "epl-curves-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string metrics = std::string(dir) + "/run.metrics.jsonl";
  {
    std::ofstream out(metrics);
    out << R"({"run":{"model":"m"}})"
        << "\n";
    for (int step = 1; step <= 4; ++step)
      out << R"({"step":)" << step << R"(,"loss":)" << 5 - step << "}\n";
    out << R"({"step":4,"eval_loss":1.5,"eval_final":false})"
        << "\n";
    out << R"({"run":{"model":"m","resumed_at":2}})"
        << "\n"; // steps 3 and 4 again
    for (int step = 3; step <= 6; ++step)
      out << R"({"step":)" << step << R"(,"loss":)" << 6 - step << "}\n";
    out << "not json\n";
    out << R"({"step":6,"eval_loss":0.5,"eval_final":true})"
        << "\n";
  }
  std::string path = writeLossCurves(metrics);
  CHECK(path == std::string(dir) + "/run.loss.svg");
  std::ifstream in(path);
  std::stringstream svg;
  svg << in.rdbuf();
  std::string text = svg.str();
  size_t line = text.find("<polyline points=\"");
  REQUIRE(line != std::string::npos);
  std::string points = text.substr(line, text.find('"', line + 18) - line);
  CHECK(std::count(points.begin(), points.end(), ',') == 6); // steps 1 to 6, once each
  size_t dots = 0;
  for (size_t at = text.find("<circle"); at != std::string::npos; at = text.find("<circle", at + 1))
    ++dots;
  CHECK(dots == 2); // the two evaluations
  CHECK_THROWS_WITH(writeLossCurves(std::string(dir) + "/none.metrics.jsonl"),
                    Contains("is not a regular file"));
  // A device reads without end (`--metrics /dev/full`): never read.
  CHECK_THROWS_WITH(writeLossCurves("/dev/full"), Contains("is not a regular file"));
  std::remove(path.c_str());
  std::remove(metrics.c_str());
  rmdir(dir);
}
