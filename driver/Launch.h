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

// Replaces this process with `mpirun -np N … epl <the same arguments>`. Returns only when
// mpirun cannot be started, with the exit code after printing why.
int launchRanks(int np, const LaunchOptions& options, int argc, char** argv);

// Whether the launcher's output was a terminal: mpirun hands the ranks pipes, so rank 0
// learns from the environment that it may draw a progress bar.
bool terminalForwarded();

// CPU threads for one rank: the cores it may run on, shared with the other ranks of its
// machine unless mpirun bound it to its own.
int threadsPerRank();

// Ranks of this MPI job on this machine, as mpirun says; 1 outside a job.
int ranksOnThisMachine();

} // namespace epl::driver
