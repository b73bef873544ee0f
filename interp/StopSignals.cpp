// The handlers of StopSignals.h. They only touch a lock-free atomic and call write(2),
// sigaction(2) and raise(3), which are async-signal-safe; the notice is copied into a fixed
// buffer before they are installed.
#include "interp/StopSignals.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unistd.h>

namespace epl::interp {

namespace {

constexpr int kSignals[4] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

std::atomic<int> gReceived{0};
char gNotice[256];
size_t gNoticeBytes = 0;

extern "C" void onStopSignal(int sig) {
  int none = 0;
  if (gReceived.compare_exchange_strong(none, sig)) {
    if (gNoticeBytes > 0) {
      ssize_t written = ::write(STDERR_FILENO, gNotice, gNoticeBytes);
      (void)written; // nothing to do about a notice that could not be shown
    }
    return;
  }
  // The second signal: its default action (the end of the process), once this returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

} // namespace

StopSignals::StopSignals(const std::string& notice) {
  static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");
  gReceived = 0;
  gNoticeBytes = std::min(notice.size(), sizeof gNotice);
  std::memcpy(gNotice, notice.data(), gNoticeBytes);
  struct sigaction handler {};
  handler.sa_handler = onStopSignal;
  sigemptyset(&handler.sa_mask);
  handler.sa_flags = SA_RESTART; // the loop polls; calls in progress just go on
  for (int i = 0; i < 4; ++i) {
    if (::sigaction(kSignals[i], nullptr, &previous_[i]) != 0 || previous_[i].sa_handler == SIG_IGN)
      continue;
    installed_[i] = ::sigaction(kSignals[i], &handler, nullptr) == 0;
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 4; ++i)
    if (installed_[i]) ::sigaction(kSignals[i], &previous_[i], nullptr);
}

int StopSignals::received() const {
  return gReceived.load();
}

std::string signalName(int sig) {
  switch (sig) {
  case SIGINT:
    return "SIGINT";
  case SIGTERM:
    return "SIGTERM";
  case SIGHUP:
    return "SIGHUP";
  case SIGUSR1:
    return "SIGUSR1";
  }
  return "signal " + std::to_string(sig);
}

} // namespace epl::interp
