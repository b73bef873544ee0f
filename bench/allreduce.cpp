// All-reduce speed of the MPI communicator against a raw blocking MPI_Allreduce of the same
// bytes, and how much of an iallReduce hides behind computation on the calling thread.
// Target: ours/raw >= 0.9 from 4 MB up (bench of a lone f32 all-reduce).
//
// Usage: mpirun -np 2 build/bench/epl_bench_allreduce [repetitions | --raw-bytes N]
// Times are medians over the repetitions, each started after a barrier; bandwidth is the
// algorithm bandwidth (bytes reduced / time). Overlap: an iallReduce, then as much
// computation on the calling thread as the all-reduce takes, then the wait; `hidden` is the
// share of the communication time that did not add to the computation's, `done` how many
// all-reduces had finished by the end of the computation (progress in the background).
// Over shared memory the copies of a transfer are CPU work: with as many busy threads as
// cores, nothing can hide, however the progress is made.
#include "backend/comm/Comm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <functional>
#include <mpi.h>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using epl::backend::Comm;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Rank 0's median time of `op` over `reps` runs, each after a barrier; rank 0 broadcasts it.
double timeIt(int reps, const std::function<void()>& op) {
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto start = Clock::now();
    op();
    times.push_back(secondsSince(start));
  }
  double t = median(times);
  MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return t;
}

// Computation that stays in the L1 cache: it competes for the core, not for memory.
double compute(int64_t iterations) {
  double x = 1;
  for (int64_t i = 0; i < iterations; ++i)
    x = std::sqrt(x + static_cast<double>(i & 1023));
  return x;
}

// Iterations of compute() that take about `seconds` on this machine.
int64_t calibrate(double seconds) {
  int64_t n = 1 << 16;
  for (;;) {
    auto start = Clock::now();
    volatile double sink = compute(n);
    (void)sink;
    double t = secondsSince(start);
    if (t > 0.02) return static_cast<int64_t>(static_cast<double>(n) * seconds / t);
    n *= 2;
  }
}

std::string gbPerSecond(double bytes, double seconds) {
  return fmt::format("{:.2f}", bytes / seconds / 1e9);
}

// `--raw-bytes N`: rank 0 prints the median seconds of one raw MPI_Allreduce of N bytes of
// floats, alone on its last line (bench/data_parallel.py compares a training step's
// gradient reduction with it).
int rawOnly(int64_t bytes, int reps) {
  auto comm = epl::backend::makeMpiComm();
  std::vector<float> data(static_cast<size_t>(bytes / 4), 1.f);
  auto op = [&] {
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  };
  op();
  double t = timeIt(reps, op);
  if (comm->rank() == 0) std::printf("%.9f\n", t);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "--raw-bytes") return rawOnly(std::atoll(argv[2]), 15);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  auto comm = epl::backend::makeMpiComm(); // initialises MPI (MPI_THREAD_MULTIPLE)
  const int rank = comm->rank();
  auto say = [&](const std::string& s) {
    if (rank == 0) std::fputs(s.c_str(), stdout);
  };
  say(fmt::format("all-reduce of f32 on {} ranks, median of {} runs\n\n", comm->size(), reps));
  say(fmt::format("{:>7} | {:>9} {:>7} | {:>9} {:>7} | {:>8} | {:>10} {:>10} {:>7} {:>5}\n", "size",
                  "raw ms", "GB/s", "ours ms", "GB/s", "ours/raw", "compute ms", "overlap ms",
                  "hidden", "done"));
  for (int mb : {1, 2, 4, 8, 16, 32, 64}) {
    const int64_t count = int64_t(mb) << 18; // floats
    std::vector<float> data(count, 1.f);
    for (int warm = 0; warm < 2; ++warm) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      comm->allReduce(data.data(), count, "warm-up");
    }
    double raw = timeIt(reps, [&] {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    });
    double ours = timeIt(reps, [&] { comm->allReduce(data.data(), count, "bench"); });

    // Overlap: as much computation as the communication takes, started right after the
    // iallReduce; hidden = the part of the communication time that did not add to the
    // computation time.
    int64_t iterations = calibrate(ours);
    double computeAlone = timeIt(reps, [&] {
      volatile double sink = compute(iterations);
      (void)sink;
    });
    int doneByWait = 0; // runs where the all-reduce had finished when the computation did
    double overlapped = timeIt(reps, [&] {
      epl::backend::Request r = comm->iallReduce(data.data(), count);
      volatile double sink = compute(iterations);
      (void)sink;
      doneByWait += comm->test(r);
      comm->wait(r, "bench");
    });
    double hidden = std::clamp((computeAlone + ours - overlapped) / ours, 0.0, 1.0);
    double bytes = static_cast<double>(count) * 4;
    say(fmt::format("{:>4} MB | {:>9.3f} {:>7} | {:>9.3f} {:>7} | {:>8.2f} | {:>10.3f} {:>10.3f} "
                    "{:>6.0f}% {:>2}/{}\n",
                    mb, raw * 1e3, gbPerSecond(bytes, raw), ours * 1e3, gbPerSecond(bytes, ours),
                    raw / ours, computeAlone * 1e3, overlapped * 1e3, hidden * 100, doneByWait,
                    reps));
  }

  // Latency of small all-reduces.
  say("\nsmall all-reduces (latency)\n");
  for (int64_t count : {1, 256, 16384}) {
    std::vector<float> data(count, 1.f);
    double raw = timeIt(reps * 20, [&] {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    });
    double ours = timeIt(reps * 20, [&] { comm->allReduce(data.data(), count, "bench"); });
    say(fmt::format("{:>7} B | raw {:>7.1f} us | ours {:>7.1f} us\n", count * 4, raw * 1e6,
                    ours * 1e6));
  }
  return 0;
}
