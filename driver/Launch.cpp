// Starting ranks through mpirun (Launch.h).
#include "driver/Launch.h"

#include "interp/StopSignals.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <iostream>
#include <sched.h>
#include <string>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace epl::driver {

namespace {

constexpr const char* kTerminalEnv = "EPL_TERMINAL";
constexpr const char* kPlanShownEnv = "EPL_PLAN_SHOWN";

int hardwareThreads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The cores this process may run on (mpirun's binding); all of them where it cannot tell.
int allowedCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return hardwareThreads();
  return std::max(1, CPU_COUNT(&set));
}

// The command line of mpirun for np ranks of this same command.
std::vector<std::string> mpirunCommand(int np, const LaunchOptions& o, int argc, char** argv) {
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) exe = argv[0];
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(np)};
  // More ranks than cores on this machine: mpirun refuses unless told it is meant.
  if (o.hostfile.empty() && np > hardwareThreads()) cmd.push_back("--oversubscribe");
  // On this one machine, no binding: mpirun's default binds each of 2 ranks to a single
  // core (and more to a socket), so on 16 cores `-np 2` ran 2 threads in all. Unbound,
  // each rank runs the machine's cores over the ranks (threadsPerRank). A binding the user
  // asks for through --mca stands.
  bool userBinds = false;
  for (size_t i = 0; i + 1 < o.mca.size(); i += 2)
    userBinds |= o.mca[i].find("binding_policy") != std::string::npos;
  if (o.hostfile.empty() && !userBinds) {
    cmd.push_back("--bind-to");
    cmd.push_back("none");
  }
  if (!o.hostfile.empty()) {
    cmd.push_back("--hostfile");
    cmd.push_back(o.hostfile);
  }
  for (size_t i = 0; i + 1 < o.mca.size(); i += 2) {
    cmd.push_back("--mca");
    cmd.push_back(o.mca[i]);
    cmd.push_back(o.mca[i + 1]);
  }
  if (isatty(1)) {
    setenv(kTerminalEnv, "1", 1);
    cmd.push_back("-x");
    cmd.push_back(kTerminalEnv);
  }
  // The launcher planned the script and printed what the plan said (its warnings).
  setenv(kPlanShownEnv, "1", 1);
  cmd.push_back("-x");
  cmd.push_back(kPlanShownEnv);
  // mpirun refuses to run as root without these; `epl run` as root (a container) means it.
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  cmd.push_back(exe);
  for (int i = 1; i < argc; ++i)
    cmd.push_back(argv[i]);
  return cmd;
}

// Signals and mpirun. OpenMPI's mpirun (4.1) ends the job on SIGINT, SIGTERM and SIGHUP:
// it sends the ranks SIGCONT, then SIGTERM a second later (odls_base_sigkill_timeout),
// then SIGKILL a second after that, too soon to finish a step and write a checkpoint; and
// it refuses to forward these three (ess_base_forward_signals). It does forward SIGUSR1
// to every rank at once. So mpirun runs in its own process group, out of reach of the
// terminal's Ctrl-C, and the launcher turns the first of these signals into SIGUSR1.
volatile sig_atomic_t gMpirun = 0;
volatile sig_atomic_t gFirstSignal = 0;
volatile sig_atomic_t gSignals = 0;

extern "C" void forwardStop(int sig) {
  if (gSignals++ == 0) {
    gFirstSignal = sig;
    ::kill(gMpirun, SIGUSR1);
  } else {
    ::kill(gMpirun, SIGTERM); // mpirun's own end of the job: the ranks' second signal
  }
}

// The handlers run one at a time, so the count of signals is never torn.
void onSignal(int sig, void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (int other : {SIGINT, SIGTERM, SIGHUP, SIGTSTP, SIGCONT})
    sigaddset(&sa.sa_mask, other);
  ::sigaction(sig, &sa, nullptr);
}

// Ctrl-Z stops mpirun (which stops the ranks) and then the launcher; `fg` or `bg` continue
// them all.
extern "C" void forwardJobControl(int sig) {
  ::kill(gMpirun, sig);
  if (sig == SIGTSTP) {
    onSignal(SIGTSTP, SIG_DFL);
    ::raise(SIGTSTP); // delivered, and stops this process, once the handler returns
  } else {
    onSignal(SIGTSTP, forwardJobControl);
  }
}

// Installs the handlers above, leaving a signal the launcher started with ignored (`nohup`
// ignores SIGHUP) ignored; mpirun inherits that.
void forwardSignals(pid_t mpirun) {
  gMpirun = mpirun;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGTSTP, SIGCONT}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    onSignal(sig, sig == SIGTSTP || sig == SIGCONT ? forwardJobControl : forwardStop);
  }
}

// Waits for mpirun, saying what a signal does as it arrives. Returns the exit code.
int waitForMpirun(pid_t mpirun) {
  int status = 0;
  sig_atomic_t told = 0;
  while (::waitpid(mpirun, &status, 0) < 0) {
    if (errno != EINTR) return 1;
    if (gSignals > told) {
      std::cerr << (told == 0 ? fmt::format("\nepl run: {}: every rank stops after its step; a "
                                            "second signal stops them at once\n",
                                            interp::signalName(gFirstSignal))
                              : std::string("\nepl run: stopping the ranks now\n"))
                << std::flush;
      told = gSignals;
    }
  }
  if (gFirstSignal != 0) return 128 + gFirstSignal;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// Starts mpirun in its own process group, tied to the launcher's life. Returns its pid, or
// -1 after saying why it could not start (a pipe carries the child's errno back, since
// only async-signal-safe calls may run between fork and exec).
pid_t startMpirun(std::vector<std::string>& cmd, int np) {
  std::vector<char*> args;
  for (std::string& a : cmd)
    args.push_back(a.data());
  args.push_back(nullptr);
  auto cannot = [&](int err) {
    std::cerr << "error: cannot start `mpirun` for -np " << np << ": " << std::strerror(err)
              << "\n  = help: install OpenMPI (Debian: `openmpi-bin`), or run with -np 1\n";
    return -1;
  };
  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) return cannot(errno);
  std::cout.flush();
  pid_t launcher = ::getpid();
  pid_t child = ::fork();
  if (child == 0) {
    ::close(errPipe[0]);
    ::setpgid(0, 0);
    // mpirun ends the job if the launcher dies (SIGKILL): no ranks left training unseen.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() == launcher) ::execvp(args[0], args.data());
    int err = errno;
    ssize_t written = ::write(errPipe[1], &err, sizeof err);
    (void)written;
    ::_exit(127);
  }
  int err = errno;
  ::close(errPipe[1]);
  ssize_t got = 0;
  if (child > 0) {
    do
      got = ::read(errPipe[0], &err, sizeof err);
    while (got < 0 && errno == EINTR);
    if (got == sizeof err) ::waitpid(child, nullptr, 0);
  }
  ::close(errPipe[0]);
  return child > 0 && got != sizeof err ? child : cannot(err);
}

} // namespace

int launchRanks(int np, const LaunchOptions& o, int argc, char** argv) {
  std::vector<std::string> cmd = mpirunCommand(np, o, argc, argv);
  pid_t mpirun = startMpirun(cmd, np);
  if (mpirun < 0) return 127;
  forwardSignals(mpirun);
  return waitForMpirun(mpirun);
}

bool terminalForwarded() {
  const char* v = std::getenv(kTerminalEnv);
  return v && std::string(v) == "1";
}

bool planShownByLauncher() {
  const char* v = std::getenv(kPlanShownEnv);
  return v && std::string(v) == "1";
}

int threadsPerRank() {
  int cpus = allowedCpus();
  if (cpus >= hardwareThreads()) return std::max(1, cpus / ranksOnThisMachine());
  // mpirun bound this rank (a hostfile's run): to its own cores, or to a socket that the
  // machine's ranks share in proportion to its cores.
  int sharing = (ranksOnThisMachine() * cpus + hardwareThreads() - 1) / hardwareThreads();
  return std::max(1, cpus / std::max(1, sharing));
}

std::string bindingNote() {
  int cpus = allowedCpus(), share = hardwareThreads() / ranksOnThisMachine();
  if (cpus >= share) return "";
  return fmt::format("note: mpirun bound each rank to {} of this machine's {} cores, which "
                     "leaves {} of them idle: `epl run -np N` starts the ranks unbound, or "
                     "give mpirun `--bind-to none`",
                     cpus, hardwareThreads(), hardwareThreads() - cpus * ranksOnThisMachine());
}

int ranksOnThisMachine() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  return 1;
}

} // namespace epl::driver
