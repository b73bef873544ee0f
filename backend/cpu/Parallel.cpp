// The CPU device's thread pool (see Parallel.h).
//
// A job is published by one atomic word, `claim_`: the job's generation in the high 32
// bits and the next unclaimed chunk in the low 32. A thread claims a chunk by a
// compare-and-swap that also checks the generation, so a worker that wakes up late can
// never take a chunk of a later job. The word is closed (new generation, chunk field
// kClosed) before the job's fields change, so a claim can never pair an old word with a
// new job's total: that once ran a chunk twice. The caller counts finished chunks and returns when
// all are done; it never waits for a worker that has not started.
#include "backend/cpu/Parallel.h"

#include "support/Assert.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <fmt/format.h>
#include <immintrin.h>
#include <mutex>
#include <pthread.h>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

namespace epl::backend::cpu {

namespace {

constexpr auto kSpin = std::chrono::microseconds(100); // busy-wait before sleeping
constexpr uint64_t kClosed = 0xffffffffu;              // chunk field while a job is being published

thread_local bool insidePool = false;

// Workers only compute, and take no asynchronous signal (the process's other threads do):
// a handler's frame is pushed below the interrupted stack pointer, which oneDNN's GEMM
// kernels point into their heap workspace. Faults stay this thread's own.
void blockAsynchronousSignals() {
  sigset_t set;
  sigfillset(&set);
  for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS})
    sigdelset(&set, fault);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

class Pool {
public:
  ~Pool() { resize(1); }

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    stopWorkers();
    try {
      for (int i = 1; i < threads; ++i)
        workers_.emplace_back([this] { workerLoop(); });
    } catch (const std::system_error& e) {
      // The system's limit (threads per user, memory for stacks), not a bug: say so, and
      // leave a pool of one thread rather than a partial one.
      int started = static_cast<int>(workers_.size()) + 1;
      stopWorkers();
      throw std::runtime_error(
          fmt::format("cannot start {} CPU threads (the system allowed {}): {}", threads, started,
                      e.code().message()));
    }
  }

  // Runs fn(chunk) for every chunk in [0, chunks) on the caller and the workers; serially
  // when another thread (another device in this process) is using the pool.
  void run(int64_t chunks, const std::function<void(int64_t)>& fn) {
    EPL_ASSERT(chunks < (int64_t{1} << 31), "too many chunks for one parallel loop");
    std::unique_lock<std::mutex> busy(runMutex_, std::try_to_lock);
    if (!busy) {
      for (int64_t c = 0; c < chunks; ++c)
        fn(c);
      return;
    }
    // Close first: a worker still holding a stale word of the previous job now fails its
    // compare-and-swap, even if it reads this job's total (published after the close).
    gen_ = (gen_ + 1) & 0xffffffffu;
    claim_.store(gen_ << 32 | kClosed, std::memory_order_seq_cst);
    job_.store(&fn, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    total_.store(chunks, std::memory_order_release);
    claim_.store(gen_ << 32, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    insidePool = true;
    work(gen_);
    insidePool = false;
    waitDone();
  }

private:
  // Claims and runs chunks of generation g until none is left.
  void work(uint64_t g) {
    for (;;) {
      uint64_t v = claim_.load(std::memory_order_acquire);
      if ((v >> 32) != g) return;
      if ((v & 0xffffffffu) == kClosed) { // the caller is still publishing this job
        _mm_pause();
        continue;
      }
      if (static_cast<int64_t>(v & 0xffffffffu) >= total_.load(std::memory_order_acquire)) return;
      if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
      (*job_.load(std::memory_order_relaxed))(static_cast<int64_t>(v & 0xffffffffu));
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void waitDone() {
    auto start = std::chrono::steady_clock::now();
    int64_t total = total_.load(std::memory_order_relaxed);
    for (int i = 0; done_.load(std::memory_order_acquire) < total; ++i) {
      _mm_pause();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() - start > kSpin)
        std::this_thread::yield();
    }
  }

  // Waits for a job newer than `seen`; returns its generation, or -1 to stop.
  int64_t waitJob(uint64_t seen) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0;; ++i) {
      if (stop_.load(std::memory_order_acquire)) return -1;
      uint64_t g = claim_.load(std::memory_order_acquire) >> 32;
      if (g != seen) return static_cast<int64_t>(g);
      _mm_pause();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > kSpin) break;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    wake_.wait(lock, [&] {
      return stop_.load(std::memory_order_seq_cst) ||
             (claim_.load(std::memory_order_seq_cst) >> 32) != seen;
    });
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    if (stop_.load()) return -1;
    return static_cast<int64_t>(claim_.load(std::memory_order_acquire) >> 32);
  }

  void workerLoop() {
    insidePool = true;
    blockAsynchronousSignals();
    uint64_t seen = claim_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      int64_t g = waitJob(seen);
      if (g < 0) return;
      seen = static_cast<uint64_t>(g);
      work(seen);
    }
  }

  void stopWorkers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true, std::memory_order_seq_cst);
      wake_.notify_all();
    }
    for (auto& t : workers_)
      t.join();
    workers_.clear();
    stop_.store(false);
  }

  std::vector<std::thread> workers_;
  std::mutex runMutex_; // one job at a time
  std::atomic<const std::function<void(int64_t)>*> job_{nullptr};
  std::atomic<int64_t> total_{0};
  uint64_t gen_ = 0;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

Pool& pool() {
  static Pool p;
  return p;
}

std::mutex& configMutex() {
  static std::mutex m;
  return m;
}

} // namespace

void setThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::lock_guard<std::mutex> lock(configMutex());
  if (pool().threads() != threads) pool().resize(threads);
}

int threadCount() {
  return pool().threads();
}

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  int threads = pool().threads();
  grain = std::max<int64_t>(grain, 1);
  if (threads == 1 || insidePool || n <= grain) return body(0, n);
  // A few chunks per thread balance the load; never smaller than the grain.
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, 4 * threads);
  int64_t size = (n + chunks - 1) / chunks;
  chunks = (n + size - 1) / size;
  std::function<void(int64_t)> chunk = [&](int64_t c) {
    body(c * size, std::min(n, (c + 1) * size));
  };
  pool().run(chunks, chunk);
}

} // namespace epl::backend::cpu
