// `epl run -np N` outside an MPI job: start the N ranks through OpenMPI's `mpirun`, each
// running the same command line (DESIGN.md §3). And what a rank needs to know of how it
// was started.
#pragma once
#include <string>
#include <vector>

namespace epl::driver {

struct LaunchOptions {
  std::string hostfile;         // --hostfile F: the machines, for a job over several
  std::vector<std::string> mca; // --mca KEY VALUE pairs, flattened
};

// Runs `mpirun -np N … epl <the same arguments>` and waits for it; returns the exit code.
// It stays between the user and mpirun for signals: the first SIGINT, SIGTERM or SIGHUP
// reaches the ranks as SIGUSR1 (stop after this step, with a checkpoint), a second one
// lets mpirun end the job, and the exit code is then 128 + the first signal. Ctrl-Z and
// `fg` stop and continue the ranks too. docs/checkpoints.md, "Signals".
int launchRanks(int np, const LaunchOptions& options, int argc, char** argv);

// Whether the launcher's output was a terminal: mpirun hands the ranks pipes, so rank 0
// learns from the environment that it may draw a progress bar.
bool terminalForwarded();

// Whether `epl run -np N` started this rank after planning the script and printing its
// warnings, which rank 0 then does not print again.
bool planShownByLauncher();

// CPU threads for one rank: the cores it may run on, shared with the other ranks of its
// machine unless mpirun bound it to its own.
int threadsPerRank();

// A note where mpirun bound this rank to fewer cores than its share of the machine's (its
// default binds each of 2 ranks to one core: `mpirun -np 2 epl run` by hand on 16 cores
// ran 2 threads in all); "" otherwise.
std::string bindingNote();

// Ranks of this MPI job on this machine, as mpirun says; 1 outside a job.
int ranksOnThisMachine();

} // namespace epl::driver
