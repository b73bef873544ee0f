// The CPU thread pool: every chunk of every job runs exactly once, and parallelFor returns
// only after all of them have finished, also when workers are descheduled mid-claim
// (more threads than cores makes that common).
#include "backend/cpu/Parallel.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

using epl::backend::cpu::parallelFor;
using epl::backend::cpu::setThreads;

TEST_CASE("parallelFor runs each index once and returns after all of them") {
  setThreads(4); // oversubscribed on small machines: the point is preemption mid-claim
  std::vector<std::atomic<int>> hits(512);
  uint64_t state = 12345;
  int64_t notRun = 0, runTwice = 0; // not run by the time parallelFor returned; or twice
  for (int job = 0; job < 20000 && notRun + runTwice == 0; ++job) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    int64_t n = 1 + static_cast<int64_t>((state >> 33) % 512);
    for (int64_t i = 0; i < n; ++i)
      hits[static_cast<size_t>(i)].store(0, std::memory_order_relaxed);
    parallelFor(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t i = 0; i < n; ++i) {
      int h = hits[static_cast<size_t>(i)].load(std::memory_order_relaxed);
      notRun += h == 0;
      runTwice += h > 1;
    }
  }
  setThreads(0);
  CHECK(notRun == 0);
  CHECK(runTwice == 0);
}
