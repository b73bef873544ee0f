// Writing and reading checkpoints (layout in Checkpoint.h).
#include "interp/Checkpoint.h"

#include "interp/checkpoint/AtomicFile.h"
#include "interp/checkpoint/Safetensors.h"
#include "support/Text.h"

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace epl::interp {

namespace fs = std::filesystem;
using checkpoint::CheckpointError;

namespace {

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

checkpoint::TensorRecord record(std::string name, std::vector<int64_t> shape,
                                const std::vector<float>& v) {
  checkpoint::TensorRecord r;
  r.name = std::move(name);
  r.dtype = ir::DType::F32;
  r.shape = std::move(shape);
  r.bytes.resize(4 * v.size());
  std::memcpy(r.bytes.data(), v.data(), r.bytes.size());
  return r;
}

std::string folderName(int64_t step) {
  return fmt::format("step-{:08}", step);
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
  std::vector<checkpoint::TensorRecord> tensors;
  for (size_t p = 0; p < m.params.size(); ++p) {
    std::vector<float> v(ex.paramElements(static_cast<int>(p)));
    ex.readParam(static_cast<int>(p), v.data());
    tensors.push_back(record(m.params[p].name, dims(m.params[p].type.shape), v));
    for (int k = 0; k < ex.statesPerParam(); ++k) {
      ex.readState(static_cast<int>(p), k, v.data());
      tensors.push_back(record(fmt::format("optimizer/{}/{}", stateName(ex, k), m.params[p].name),
                               dims(m.params[p].type.shape), v));
    }
  }
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
  checkpoint::writeSafetensors((temp / "model.safetensors").string(), tensors, meta);
  nlohmann::json manifest{
      {"format", "epl-checkpoint"},
      {"version", 1},
      {"model", m.modelName},
      {"step", st.step},
      {"seed", st.seed},
      {"optimizer", m.train.optimizer.kind},
      {"rng", {{"kind", "counter"}, {"seed", st.seed}, {"step", st.step}}},
      {"data", {{"order", "seeded permutation per epoch"}, {"next_step", st.step}}},
      {"files", {"model.safetensors"}}};
  checkpoint::writeFileAtomic((temp / "manifest.json").string(), manifest.dump(2) + "\n");
  if (fs::exists(final))
    throw CheckpointError(fmt::format("`{}` already exists; it is left as it is", final.string()));
  fs::rename(temp, final, ec);
  if (ec) throw CheckpointError(fmt::format("cannot rename `{}`: {}", temp.string(), ec.message()));
  syncDir(dir);
  if (keep > 0) {
    std::vector<fs::path> all;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0)
        all.push_back(e.path());
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + keep < all.size(); ++i)
      fs::remove_all(all[i], ec);
  }
  return final.string();
}

std::optional<std::string> latestCheckpoint(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0 &&
        fs::exists(e.path() / "manifest.json"))
      all.push_back(e.path());
  if (all.empty()) return std::nullopt;
  std::sort(all.begin(), all.end());
  return all.back().string();
}

CheckpointState loadCheckpoint(Executor& ex, const std::string& folder, bool withOptimizer) {
  const ir::Module& m = ex.module();
  std::string file = (fs::path(folder) / "model.safetensors").string();
  std::string manifestPath = (fs::path(folder) / "manifest.json").string();
  CheckpointState st;
  {
    std::ifstream in(manifestPath);
    if (!in) throw CheckpointError(fmt::format("cannot read `{}`", manifestPath));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer())
      throw CheckpointError(fmt::format("`{}` is not a checkpoint manifest", manifestPath));
    st.step = j["step"].get<int64_t>();
    st.seed = j.value("seed", uint64_t{0});
  }
  std::vector<checkpoint::TensorRecord> records = checkpoint::readSafetensors(file);
  std::map<std::string, const checkpoint::TensorRecord*> byName;
  for (const auto& r : records)
    byName[r.name] = &r;
  auto fetch = [&](const std::string& name, const std::vector<int64_t>& shape) {
    auto it = byName.find(name);
    if (it == byName.end())
      throw CheckpointError(fmt::format("`{}` has no tensor `{}`", file, name));
    const checkpoint::TensorRecord& r = *it->second;
    if (r.dtype != ir::DType::F32 || r.shape != shape)
      throw CheckpointError(fmt::format("`{}`: tensor `{}` is {}{}, but the model's is F32{}", file,
                                        name, r.dtype.name(), shapeText(r.shape),
                                        shapeText(shape)));
    return reinterpret_cast<const float*>(r.bytes.data());
  };
  // Check everything before writing anything, so a bad file leaves the run untouched.
  std::vector<std::pair<int, const float*>> params;
  std::vector<std::tuple<int, int, const float*>> states;
  for (size_t p = 0; p < m.params.size(); ++p) {
    auto shape = dims(m.params[p].type.shape);
    params.push_back({static_cast<int>(p), fetch(m.params[p].name, shape)});
    for (int k = 0; withOptimizer && k < ex.statesPerParam(); ++k)
      states.push_back(
          {static_cast<int>(p), k,
           fetch(fmt::format("optimizer/{}/{}", stateName(ex, k), m.params[p].name), shape)});
  }
  for (auto [p, v] : params)
    ex.writeParam(p, v);
  for (auto [p, k, v] : states)
    ex.writeState(p, k, v);
  return st;
}

} // namespace epl::interp
