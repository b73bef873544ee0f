// Speed of the communication check (ir/StreamCheck.h) on 1F1B pipeline streams of 8 stages
// (one and two replicas) and growing micro-batch counts. The time per event should stay
// about flat: the check is linear in the events.
//
// Usage: epl_bench_stream_check [repetitions]
#include "ir/StreamCheck.h"
#include "tests/unit/PipelineStreams.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fmt/format.h>

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  int repetitions = argc > 1 ? std::atoi(argv[1]) : 5;
  fmt::print("{:>6} {:>8} {:>10} {:>10} {:>12}\n", "ranks", "micro", "events", "ms", "ns/event");
  for (auto [replicas, micro] : {std::pair{1, 125}, {1, 1250}, {1, 12500}, {2, 1250}}) {
    epl::testing::PipelineShape p;
    p.stages = 8;
    p.replicas = replicas;
    p.microBatches = micro;
    p.schedule = epl::testing::PipelineSchedule::OneFOneB;
    auto streams = epl::testing::pipelineStreams(p);
    size_t events = 0;
    for (const auto& r : streams.ranks)
      events += r.size();
    double best = 1e30;
    for (int i = 0; i < repetitions; ++i) {
      auto t = Clock::now();
      auto problem = epl::ir::checkStreams(streams);
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
      if (problem) {
        fmt::print("unexpected: {}\n", problem->str());
        return 1;
      }
      best = std::min(best, ms);
    }
    fmt::print("{:>6} {:>8} {:>10} {:>10.2f} {:>12.1f}\n", streams.ranks.size(), micro, events,
               best, best * 1e6 / static_cast<double>(events));
  }
}
