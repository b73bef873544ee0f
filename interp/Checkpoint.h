// Checkpoints of a run: DIR/step-NNNNNNNN/ holds `model.safetensors` (parameters and
// optimizer states) and `manifest.json` (step, seed, model, optimizer, files). A
// checkpoint appears whole or not at all: it is written under a temporary name, every
// file fsynced, then renamed. docs/architecture.md, "Checkpoints".
#pragma once
#include "interp/Executor.h"

#include <cstdint>
#include <optional>
#include <string>

namespace epl::interp {

struct CheckpointState {
  int64_t step = 0; // optimizer steps done
  uint64_t seed = 0;
};

// Writes the checkpoint of `step` into `dir` (created if needed) and, when keep > 0,
// removes all but the newest `keep`. Returns its folder. Throws checkpoint::CheckpointError.
std::string saveCheckpoint(const Executor& ex, const std::string& dir, const CheckpointState& st,
                           int64_t keep);
// The newest complete checkpoint folder in `dir`, if any.
std::optional<std::string> latestCheckpoint(const std::string& dir);
// Loads parameters and optimizer states of `folder` into `ex`, checking every name and
// shape against the model. Throws checkpoint::CheckpointError naming the file.
CheckpointState loadCheckpoint(Executor& ex, const std::string& folder, bool withOptimizer);

} // namespace epl::interp
