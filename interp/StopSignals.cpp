// The signal handling of StopSignals.h, in three steps:
// 1. The constructor installs a handler for each signal not ignored, blocks those signals in
//    the calling thread (so in every thread it starts from then on, which inherit its mask),
//    and starts the watcher thread, which takes them with sigwait.
// 2. Threads started before (MPI's) may still take one, through the handler: it only
//    touches a lock-free atomic and calls write(2), sigaction(2), pthread_sigmask(3) and
//    raise(3), which are async-signal-safe; the notice is copied into a fixed buffer first.
// 3. The destructor stops the watcher, unblocks what it blocked and puts the handlers back.
#include "interp/StopSignals.h"

#include <algorithm>
#include <cstring>
#include <pthread.h>
#include <system_error>
#include <unistd.h>

namespace epl::interp {

namespace {

constexpr int kSignals[4] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

std::atomic<int> gReceived{0};
char gNotice[256];
size_t gNoticeBytes = 0;

// A stop signal, received by the handler or the watcher. The first is recorded and the
// notice written; a second ends the process by its default action.
void onStop(int sig) {
  int none = 0;
  if (gReceived.compare_exchange_strong(none, sig)) {
    if (gNoticeBytes > 0) {
      ssize_t written = ::write(STDERR_FILENO, gNotice, gNoticeBytes);
      (void)written; // nothing to do about a notice that could not be shown
    }
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr); // the watcher blocks it, as does a handler
  ::raise(sig);
}

extern "C" void onStopSignal(int sig) {
  onStop(sig);
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
  sigemptyset(&taken_);
  for (int i = 0; i < 4; ++i) {
    if (::sigaction(kSignals[i], nullptr, &previous_[i]) != 0 || previous_[i].sa_handler == SIG_IGN)
      continue;
    installed_[i] = ::sigaction(kSignals[i], &handler, nullptr) == 0;
    if (installed_[i]) sigaddset(&taken_, kSignals[i]);
  }
  sigset_t before;
  ::pthread_sigmask(SIG_BLOCK, &taken_, &before);
  sigemptyset(&unblock_);
  for (int sig : kSignals)
    if (sigismember(&taken_, sig) && !sigismember(&before, sig)) sigaddset(&unblock_, sig);
  if (sigisemptyset(&taken_)) return;
  try {
    watcher_ = std::thread([this] { watch(); });
  } catch (const std::system_error&) {
    // No thread to spare: the handler takes the signals, on any thread, this one included.
    ::pthread_sigmask(SIG_UNBLOCK, &unblock_, nullptr);
    sigemptyset(&unblock_);
  }
}

// The watcher: every signal it takes is handled as the handler would, but outside any
// computation. The destructor wakes it with one of the signals after setting `stopping_`.
void StopSignals::watch() {
  for (;;) {
    int sig = 0;
    if (::sigwait(&taken_, &sig) != 0) continue;
    if (stopping_.load()) return;
    onStop(sig);
  }
}

StopSignals::~StopSignals() {
  if (watcher_.joinable()) {
    stopping_ = true;
    for (int sig : kSignals)
      if (sigismember(&taken_, sig)) {
        ::pthread_kill(watcher_.native_handle(), sig);
        break;
      }
    watcher_.join();
  }
  // A signal that arrived since is delivered here, to the handler, once unblocked.
  ::pthread_sigmask(SIG_UNBLOCK, &unblock_, nullptr);
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
