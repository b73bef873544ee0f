// Writing, finding, pruning and loading checkpoints (layout in Checkpoint.h).
#include "interp/Checkpoint.h"

#include "interp/checkpoint/AtomicFile.h"
#include "interp/checkpoint/Manifest.h"
#include "interp/checkpoint/Safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <unistd.h>

namespace epl::interp {

namespace fs = std::filesystem;
using checkpoint::CheckpointError;
using checkpoint::Manifest;
using checkpoint::TensorRecord;

namespace {

constexpr const char* kTensorFile = "model.safetensors";
constexpr const char* kManifestFile = "manifest.json";

const char* stateName(const Executor& ex, int k) {
  if (ex.statesPerParam() == 1) return "momentum_buffer";
  return k == 0 ? "exp_avg" : "exp_avg_sq";
}

std::vector<int64_t> dims(const ir::Shape& s) {
  std::vector<int64_t> out;
  for (const ir::Dim& d : s)
    out.push_back(d.coef);
  return out;
}

std::string shapeText(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

TensorRecord record(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  TensorRecord r;
  r.name = std::move(name);
  r.dtype = ir::DType::F32;
  r.shape = std::move(shape);
  r.bytes.resize(4 * v.size());
  std::memcpy(r.bytes.data(), v.data(), r.bytes.size());
  return r;
}

// Every parameter, each trainable one followed by its optimizer states (a running
// statistic has none: no optimizer step reads or writes them, and PyTorch saves none).
std::vector<TensorRecord> tensorsOf(const Executor& ex) {
  const ir::Module& m = ex.module();
  std::vector<TensorRecord> tensors;
  for (size_t p = 0; p < m.params.size(); ++p) {
    std::vector<float> v(ex.paramElements(static_cast<int>(p)));
    ex.readParam(static_cast<int>(p), v.data());
    tensors.push_back(record(m.params[p].name, dims(m.params[p].type.shape), v));
    for (int k = 0; m.params[p].trainable && k < ex.statesPerParam(); ++k) {
      ex.readState(static_cast<int>(p), k, v.data());
      tensors.push_back(record(fmt::format("optimizer/{}/{}", stateName(ex, k), m.params[p].name),
                               dims(m.params[p].type.shape), v));
    }
  }
  return tensors;
}

std::string folderName(int64_t step) {
  return fmt::format("step-{:08}", step);
}

// The number in a folder name `step-<digits>` (at most 18, so it fits), else nullopt.
std::optional<int64_t> stepOfName(const std::string& name) {
  const std::string prefix = "step-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() ||
      name.size() > prefix.size() + 18 ||
      name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
    return std::nullopt;
  return std::stoll(name.substr(prefix.size()));
}

struct StepFolder {
  int64_t step;
  fs::path path;
};

// The folders of `dir` named `step-<digits>` that hold a manifest, lowest step first (by
// number: `step-100000000` comes after `step-99999999`). Links are left out.
std::vector<StepFolder> stepFolders(const std::string& dir) {
  std::vector<StepFolder> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto step = stepOfName(e.path().filename().string());
    if (step && !e.is_symlink(ec) && e.is_directory(ec) && fs::exists(e.path() / kManifestFile, ec))
      out.push_back({*step, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const StepFolder& a, const StepFolder& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

// Whether EPL wrote `f`: it bears the name EPL gives its step, and its manifest reads and
// names that step. Nothing else is ever removed.
bool writtenByEpl(const StepFolder& f) {
  if (f.path.filename() != folderName(f.step)) return false;
  try {
    return checkpoint::readManifest((f.path / kManifestFile).string()).step == f.step;
  } catch (const CheckpointError&) {
    return false;
  }
}

// Removes all but the newest `keep` of EPL's checkpoints in `dir`; `current`, the one just
// written, is always one of those kept.
void prune(const std::string& dir, const fs::path& current, int64_t keep) {
  std::vector<StepFolder> ours;
  for (StepFolder& f : stepFolders(dir))
    if (f.path != current && writtenByEpl(f)) ours.push_back(std::move(f));
  int64_t drop = static_cast<int64_t>(ours.size()) - (keep - 1);
  std::error_code ec;
  for (int64_t i = 0; i < drop; ++i)
    fs::remove_all(ours[i].path, ec);
}

// Makes a rename inside `dir` durable.
void syncDir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

} // namespace

std::string saveCheckpoint(const Executor& ex, const std::string& dir, const CheckpointState& st,
                           int64_t keep) {
  const ir::Module& m = ex.module();
  std::vector<TensorRecord> tensors = tensorsOf(ex);
  Manifest manifest;
  manifest.model = m.modelName;
  manifest.optimizer = m.train.optimizer.kind;
  manifest.step = st.step;
  manifest.steps = st.steps;
  manifest.seed = st.seed;
  for (const TensorRecord& t : tensors)
    manifest.crc32[t.name] = checkpoint::crc32Of(t.bytes);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(fmt::format("cannot create `{}`: {}", dir, ec.message()));
  fs::path final = fs::path(dir) / folderName(st.step);
  fs::path temp = fs::path(dir) / ("." + folderName(st.step) + ".tmp");
  fs::remove_all(temp, ec);
  fs::create_directories(temp, ec);
  if (ec) throw CheckpointError(fmt::format("cannot create `{}`: {}", temp.string(), ec.message()));
  std::map<std::string, std::string> meta{{"format", "epl-checkpoint"},
                                          {"step", std::to_string(st.step)},
                                          {"seed", std::to_string(st.seed)},
                                          {"model", m.modelName}};
  if (m.scalesLoss()) { // amp = fp16: where the dynamic loss scale stands
    meta["loss_scale"] = fmt::format("{}", ex.lossScale());
    meta["loss_scale_steps"] = std::to_string(ex.lossScaleSteps());
  }
  checkpoint::writeSafetensors((temp / kTensorFile).string(), tensors, meta);
  checkpoint::writeFileAtomic((temp / kManifestFile).string(), checkpoint::manifestText(manifest));
  if (fs::exists(final))
    throw CheckpointError(fmt::format("`{}` already exists; it is left as it is", final.string()));
  fs::rename(temp, final, ec);
  if (ec) throw CheckpointError(fmt::format("cannot rename `{}`: {}", temp.string(), ec.message()));
  syncDir(dir);
  if (keep > 0) prune(dir, final, keep);
  return final.string();
}

std::optional<std::string> latestCheckpoint(const std::string& dir) {
  std::vector<StepFolder> all = stepFolders(dir);
  if (all.empty()) return std::nullopt;
  return all.back().path.string();
}

namespace {

// The help for a checkpoint that cannot be used: set it aside, keeping it, and the
// checkpoint before it is the newest.
std::string setAsideHelp(const fs::path& folder) {
  return fmt::format("move `{}` out of `{}` to use the checkpoint before it",
                     folder.filename().string(), folder.parent_path().string());
}

// Runs `read`, giving an error without a help of its own the set-aside help.
template <typename Read> auto orSetAside(const fs::path& folder, Read read) {
  try {
    return read();
  } catch (const CheckpointError& e) {
    if (!e.help.empty()) throw;
    throw CheckpointError(e.what(), setAsideHelp(folder), e.key);
  }
}

// The manifest against its folder's name and the script.
void checkAgainstRun(const Manifest& man, const fs::path& folder, const ir::Module& m,
                     LoadPurpose purpose, std::vector<CheckpointWarning>& warnings) {
  std::string name = folder.filename().string();
  auto named = stepOfName(name);
  if (named && *named != man.step)
    throw CheckpointError(fmt::format("`{}` says `step` {}, but its folder is `{}`",
                                      (folder / kManifestFile).string(), man.step, name),
                          fmt::format("rename the folder `{}` if the manifest is right, or {}",
                                      folderName(man.step), setAsideHelp(folder)));
  if (man.model != m.modelName)
    throw CheckpointError(
        fmt::format("`{}` is a checkpoint of model `{}`, and this script trains `{}`",
                    folder.string(), man.model, m.modelName),
        "resume with the script that wrote it, or choose another checkpoint `dir`");
  if (man.version < 2)
    warnings.push_back({"checkpoint",
                        fmt::format("`{}` is checkpoint format version {}, which has no checksums: "
                                    "its tensors are not verified",
                                    folder.string(), man.version),
                        "the checkpoints this run writes have them", ""});
  if (purpose != LoadPurpose::Resume) return;
  const std::string& optimizer = m.train.optimizer.kind;
  if (man.optimizer != optimizer)
    throw CheckpointError(
        fmt::format("`{}` was written with optimizer `{}`, and the script says `{}`",
                    folder.string(), man.optimizer, optimizer),
        fmt::format("write `optimizer = {}(…)` to continue it, or start afresh with another "
                    "checkpoint `dir`",
                    man.optimizer),
        "optimizer");
  auto seed = static_cast<uint64_t>(m.train.seed);
  if (man.seed != seed)
    warnings.push_back(
        {m.train.keyLocs.count("seed") ? "seed" : "checkpoint",
         fmt::format("`{}` was written with `seed = {}`, and the script says `seed = {}`",
                     folder.string(), man.seed, seed),
         fmt::format("the data order and dropout after step {} follow `seed = {}`, so the run "
                     "differs from one that never stopped",
                     man.step, seed),
         fmt::format("set `seed = {}` to continue it as it was", man.seed)});
  // A schedule over another number of steps: the rate from here on is not the original's.
  const std::string& schedule = m.train.lrSchedule.kind;
  if (man.steps > 0 && man.steps != m.train.steps &&
      ir::lrScheduleOf(m.train.lrSchedule) != ir::LrSchedule::Constant)
    warnings.push_back(
        {m.train.keyLocs.count("steps") ? "steps" : "checkpoint",
         fmt::format("`{}` was written by a run of {} steps, and this run has {}", folder.string(),
                     man.steps, m.train.steps),
         fmt::format("the `{}` learning-rate schedule now spans {} steps: from step {} the rate "
                     "differs from the original run's",
                     schedule, m.train.steps, man.step + 1),
         fmt::format("pass --steps {} to continue the original schedule", man.steps)});
}

// The tensor file against its manifest: the metadata it repeats, the tensors it lists, and
// each tensor's CRC-32 (a manifest of version 1 has none).
void checkTensors(const Manifest& man, const std::map<std::string, std::string>& meta,
                  const std::vector<TensorRecord>& records, const fs::path& folder) {
  std::string file = (folder / kTensorFile).string();
  auto fail = [&](const std::string& what) {
    throw CheckpointError(fmt::format("`{}` {}", file, what), setAsideHelp(folder));
  };
  std::map<std::string, std::string> expected{{"format", "epl-checkpoint"},
                                              {"model", man.model},
                                              {"step", std::to_string(man.step)},
                                              {"seed", std::to_string(man.seed)}};
  for (const auto& [key, value] : expected) {
    auto it = meta.find(key);
    if (it != meta.end() && it->second != value)
      fail(fmt::format("says `{}` {}, and its manifest says {}", key, it->second, value));
  }
  if (man.version < 2) return;
  for (const TensorRecord& r : records) {
    auto it = man.crc32.find(r.name);
    if (it == man.crc32.end())
      fail(fmt::format("holds tensor `{}`, which its manifest lacks", r.name));
    uint32_t crc = checkpoint::crc32Of(r.bytes);
    if (crc != it->second)
      throw CheckpointError(fmt::format("tensor `{}` of `{}` fails its checksum (CRC-32 {:08x}, "
                                        "and the manifest says {:08x})",
                                        r.name, file, crc, it->second),
                            fmt::format("the file is damaged: {}", setAsideHelp(folder)));
  }
  if (records.size() != man.crc32.size())
    for (const auto& entry : man.crc32) {
      const std::string& name = entry.first;
      if (std::none_of(records.begin(), records.end(),
                       [&](const TensorRecord& r) { return r.name == name; }))
        fail(fmt::format("lacks tensor `{}`, which its manifest lists", name));
    }
}

// Copies the model's parameters (and optimizer states) out of `records` into `ex`, checking
// every name and shape first, so a bad file leaves the run untouched.
void install(Executor& ex, const std::vector<TensorRecord>& records, const std::string& file,
             bool withOptimizer) {
  const ir::Module& m = ex.module();
  std::map<std::string, const TensorRecord*> byName;
  for (const auto& r : records)
    byName[r.name] = &r;
  auto fetch = [&](const std::string& name, const std::vector<int64_t>& shape) {
    auto it = byName.find(name);
    if (it == byName.end())
      throw CheckpointError(fmt::format("`{}` has no tensor `{}`", file, name));
    const TensorRecord& r = *it->second;
    if (r.dtype != ir::DType::F32 || r.shape != shape)
      throw CheckpointError(fmt::format("`{}`: tensor `{}` is {}{}, but the model's is F32{}", file,
                                        name, r.dtype.name(), shapeText(r.shape),
                                        shapeText(shape)));
    return reinterpret_cast<const float*>(r.bytes.data());
  };
  std::vector<std::pair<int, const float*>> params;
  std::vector<std::tuple<int, int, const float*>> states;
  for (size_t p = 0; p < m.params.size(); ++p) {
    auto shape = dims(m.params[p].type.shape);
    params.push_back({static_cast<int>(p), fetch(m.params[p].name, shape)});
    // Checkpoints before running statistics lost their states hold zeros for them: ignored.
    for (int k = 0; withOptimizer && m.params[p].trainable && k < ex.statesPerParam(); ++k)
      states.push_back(
          {static_cast<int>(p), k,
           fetch(fmt::format("optimizer/{}/{}", stateName(ex, k), m.params[p].name), shape)});
  }
  for (auto [p, v] : params)
    ex.writeParam(p, v);
  for (auto [p, k, v] : states)
    ex.writeState(p, k, v);
}

} // namespace

LoadedCheckpoint loadCheckpoint(Executor& ex, const std::string& folderText, LoadPurpose purpose) {
  fs::path folder = fs::path(folderText).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path(); // `ckpt/step-…/`
  LoadedCheckpoint out;
  Manifest man = orSetAside(
      folder, [&] { return checkpoint::readManifest((folder / kManifestFile).string()); });
  checkAgainstRun(man, folder, ex.module(), purpose, out.warnings);
  std::string file = (folder / kTensorFile).string();
  std::map<std::string, std::string> meta;
  std::vector<TensorRecord> records =
      orSetAside(folder, [&] { return checkpoint::readSafetensors(file, &meta); });
  checkTensors(man, meta, records, folder);
  install(ex, records, file, purpose == LoadPurpose::Resume);
  auto scale = meta.find("loss_scale"), steps = meta.find("loss_scale_steps");
  if (purpose == LoadPurpose::Resume && ex.module().scalesLoss() && scale != meta.end() &&
      steps != meta.end()) {
    double v = std::strtod(scale->second.c_str(), nullptr);
    long n = std::strtol(steps->second.c_str(), nullptr, 10);
    if (std::isfinite(v) && v > 0 && n >= 0 && n < ir::Policy::kLossScaleWindow)
      ex.setLossScale(v, static_cast<int>(n));
  }
  out.state = {man.step, man.seed, man.steps};
  return out;
}

} // namespace epl::interp
