// Stopping a run cleanly on a signal. The first SIGINT, SIGTERM, SIGHUP or SIGUSR1 is only
// recorded: the training loop asks after each step, every rank agrees, and the run writes a
// checkpoint and ends (Trainer.cpp). A second one ends the process at once, by the signal's
// default action. A signal the process started with ignored (`nohup` ignores SIGHUP) stays
// ignored. docs/checkpoints.md, "Signals".
//
// The signals never interrupt the thread that constructs StopSignals (the one that trains)
// or any thread it starts afterwards (the CPU device's pool): they are blocked there and
// one thread of StopSignals' own takes them. A handler's frame is pushed below the
// interrupted stack pointer, and oneDNN's GEMM kernels point it into their heap workspace,
// so a handler run inside one corrupts the heap.
#pragma once
#include <atomic>
#include <csignal>
#include <string>
#include <thread>

namespace epl::interp {

class StopSignals {
public:
  // Takes the signals for the life of the object; construct and destroy it on one thread.
  // `notice`, when not empty, is written to stderr as soon as the first signal arrives.
  explicit StopSignals(const std::string& notice);
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals(); // puts the previous handlers and this thread's signal mask back

  // The first signal received, or 0.
  int received() const;

private:
  void watch();

  struct sigaction previous_[4] = {};
  bool installed_[4] = {};
  sigset_t taken_;   // the signals installed: the watcher waits for these
  sigset_t unblock_; // those of them the constructing thread had not blocked before
  std::thread watcher_;
  std::atomic<bool> stopping_{false};
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", or "signal N".
std::string signalName(int sig);

} // namespace epl::interp
