// The lock a run holds on its checkpoint folder, so that a second run on the same folder
// stops at its start, naming the first, instead of failing at its first save (or worse,
// removing the first run's checkpoints under `keep`). It is `DIR/.epl-lock`, locked with
// flock(2) for the life of the run and holding "PID HOST" of the run that holds it.
#pragma once
#include <string>

namespace epl::checkpoint {

class FolderLock {
public:
  // Creates `dir` if needed, checks that a checkpoint can be written into it, and locks it.
  // Throws CheckpointError naming the folder and why, or the pid and host of the run that
  // holds it.
  explicit FolderLock(const std::string& dir);
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  // Unlocks. The file stays: removing it would race with a run that has just opened it.
  ~FolderLock();

private:
  int fd_ = -1;
};

} // namespace epl::checkpoint
