// Checkpoints of a run: DIR/step-NNNNNNNN/ holds `model.safetensors` (parameters and
// optimizer states) and `manifest.json` (step, seed, model, optimizer, a CRC-32 per tensor;
// checkpoint/Manifest.h). A checkpoint appears whole or not at all: it is written under a
// temporary name, every file fsynced, then renamed. docs/checkpoints.md.
#pragma once
#include "interp/Executor.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace epl::interp {

struct CheckpointState {
  int64_t step = 0; // optimizer steps done
  uint64_t seed = 0;
  int64_t steps = 0; // the run's `steps`, which its learning-rate schedule spans; 0: unknown
};

// Writes the checkpoint of `step` into `dir` (created if needed) and, when keep > 0,
// removes all but the newest `keep` of the checkpoints EPL wrote there (by step number;
// folders it did not write are never touched). Returns its folder. Throws
// checkpoint::CheckpointError.
std::string saveCheckpoint(const Executor& ex, const std::string& dir, const CheckpointState& st,
                           int64_t keep);

// The folder in `dir` named `step-<digits>` with the largest number that holds a manifest,
// if any. It is not checked here: loading it reports what is wrong with it.
std::optional<std::string> latestCheckpoint(const std::string& dir);

// What a load is for: resuming needs the optimizer states and the seed of the run that
// wrote the checkpoint; sampling needs the weights alone.
enum class LoadPurpose { Resume, Weights };

// Something odd about a checkpoint that does not stop a run, for a warning at the
// script's `key`.
struct CheckpointWarning {
  std::string key, message, note, help;
};

struct LoadedCheckpoint {
  CheckpointState state;
  std::vector<CheckpointWarning> warnings;
};

// Loads `folder` into `ex` after checking the manifest against the folder's name and the
// script (model; optimizer and seed for a resume), the tensor file against the manifest
// (its metadata, names, and each tensor's CRC-32), and every name and shape against the
// model. Throws checkpoint::CheckpointError naming the file and what would fix it; nothing
// is loaded then.
LoadedCheckpoint loadCheckpoint(Executor& ex, const std::string& folder, LoadPurpose purpose);

} // namespace epl::interp
