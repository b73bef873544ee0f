// The CPU device's one thread pool: every parallel loop of the kernels, GEMM slices
// included, runs on it (the sgemm, oneDNN's or OpenBLAS's, is kept single-threaded), so
// two pools never compete for the cores. Its workers take no asynchronous signals.
//
// Work is cut into chunks that threads claim one at a time, so a thread the OS has
// descheduled holds up only the chunk it is running. Idle workers spin briefly, then
// sleep. Kernels make every chunk's result independent of which thread runs it and of
// the chunk count, so results are the same on any number of threads and run to run.
#pragma once
#include <cstdint>
#include <functional>

namespace epl::backend::cpu {

// Threads for parallel loops, the caller included (0: all cores). Idempotent. Throws
// std::runtime_error when the system will not start that many.
void setThreads(int threads);
int threadCount();

// Runs body(begin, end) over [0, n) in chunks of at least `grain` indices, on the pool.
// Serial when n <= grain, when one thread is configured, or when called from inside
// another parallelFor.
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

} // namespace epl::backend::cpu
