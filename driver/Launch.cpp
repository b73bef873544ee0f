// Starting ranks through mpirun (Launch.h).
#include "driver/Launch.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sched.h>
#include <string>
#include <thread>
#include <unistd.h>

namespace epl::driver {

namespace {

constexpr const char* kTerminalEnv = "EPL_TERMINAL";

int hardwareThreads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

} // namespace

int launchRanks(int np, const LaunchOptions& o, int argc, char** argv) {
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) exe = argv[0];
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(np)};
  // More ranks than cores on this machine: mpirun refuses unless told it is meant.
  if (o.hostfile.empty() && np > hardwareThreads()) cmd.push_back("--oversubscribe");
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
  // mpirun refuses to run as root without these; `epl run` as root (a container) means it.
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  cmd.push_back(exe);
  for (int i = 1; i < argc; ++i)
    cmd.push_back(argv[i]);
  std::vector<char*> args;
  for (std::string& a : cmd)
    args.push_back(a.data());
  args.push_back(nullptr);
  std::cout.flush();
  execvp(args[0], args.data());
  int err = errno;
  std::cerr << "error: cannot start `mpirun` for -np " << np << ": " << std::strerror(err)
            << "\n  = help: install OpenMPI (Debian: `openmpi-bin`), or run with -np 1\n";
  return 127;
}

bool terminalForwarded() {
  const char* v = std::getenv(kTerminalEnv);
  return v && std::string(v) == "1";
}

int threadsPerRank() {
  cpu_set_t set;
  int cpus = hardwareThreads();
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  if (cpus < hardwareThreads()) return cpus; // mpirun bound this rank to its own cores
  return std::max(1, cpus / ranksOnThisMachine());
}

int ranksOnThisMachine() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  return 1;
}

} // namespace epl::driver
