// Stopping a run cleanly on a signal. The first SIGINT, SIGTERM, SIGHUP or SIGUSR1 is only
// recorded: the training loop asks after each step, every rank agrees, and the run writes a
// checkpoint and ends (Trainer.cpp). A second one ends the process at once, by the signal's
// default action. A signal the process started with ignored (`nohup` ignores SIGHUP) stays
// ignored. docs/checkpoints.md, "Signals".
#pragma once
#include <csignal>
#include <string>

namespace epl::interp {

class StopSignals {
public:
  // Installs the handlers for the life of the object. `notice`, when not empty, is written
  // to stderr as soon as the first signal arrives.
  explicit StopSignals(const std::string& notice);
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals(); // puts the previous handlers back

  // The first signal received, or 0.
  int received() const;

private:
  struct sigaction previous_[4] = {};
  bool installed_[4] = {};
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", or "signal N".
std::string signalName(int sig);

} // namespace epl::interp
