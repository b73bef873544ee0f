// What a run shows while it trains: the ETA of a resumed run, from the steps done since it
// started rather than since step 0.
#include "interp/Progress.h"

#include <catch2/catch.hpp>

#include <cstring>
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
