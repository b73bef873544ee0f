// Writing and checking checkpoint manifests (Manifest.h), with nlohmann-json and zlib.
#include "interp/checkpoint/Manifest.h"

#include "interp/checkpoint/AtomicFile.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <fstream>
#include <set>

namespace epl::checkpoint {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "epl-checkpoint";
constexpr const char* kRngKind = "counter";
constexpr const char* kDataOrder = "seeded permutation per epoch";
constexpr const char* kModelFile = "model.safetensors";

using Is = bool (json::*)() const noexcept;

[[noreturn]] void fail(const std::string& path, const std::string& what, std::string help = {}) {
  throw CheckpointError(fmt::format("`{}` {}", path, what), std::move(help));
}

// `obj[key]`, which must hold a value of `kind` (as `is` tells); `name` is how a message
// shows the field (`rng.step`).
const json& need(const std::string& path, const json& obj, const std::string& key,
                 const std::string& name, Is is, const char* kind) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, fmt::format("has no `{}`", name));
  if (!((*it).*is)()) fail(path, fmt::format("has `{}` that is not {}", name, kind));
  return *it;
}

const std::string& needString(const std::string& path, const json& obj, const std::string& key,
                              const std::string& name) {
  return need(path, obj, key, name, &json::is_string, "a string").get_ref<const std::string&>();
}

// An integer field; a negative one is returned for the caller to name, one past 2^63 - 1 is
// an error.
int64_t needInteger(const std::string& path, const json& obj, const std::string& key,
                    const std::string& name) {
  const json& v = need(path, obj, key, name, &json::is_number_integer, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(path, fmt::format("has `{}` {}, too large for a step count", name, v.get<uint64_t>()));
  return v.get<int64_t>();
}

void onlyFields(const std::string& path, const json& obj, const std::string& prefix,
                const std::set<std::string>& known) {
  for (const auto& [k, v] : obj.items())
    if (!known.count(k)) fail(path, fmt::format("has an unknown field `{}{}`", prefix, k));
}

int readVersion(const std::string& path, const json& j) {
  int64_t v = needInteger(path, j, "version", "version");
  if (v > kManifestVersion)
    fail(path,
         fmt::format("is checkpoint format version {}, written by a newer EPL; this EPL reads "
                     "versions 1 to {}",
                     v, kManifestVersion),
         "resume with the EPL that wrote it, or a newer one");
  if (v < 1) fail(path, fmt::format("has `version` {}, which no EPL writes", v));
  return static_cast<int>(v);
}

// `rng` and `data` restate the step and seed (the run's random state is a function of
// them); `files` is the one tensor file.
void checkRecords(const std::string& path, const json& j, const Manifest& m) {
  const json& rng = need(path, j, "rng", "rng", &json::is_object, "an object");
  onlyFields(path, rng, "rng.", {"kind", "seed", "step"});
  if (needString(path, rng, "kind", "rng.kind") != kRngKind)
    fail(path, fmt::format("has `rng.kind` other than `{}`", kRngKind));
  if (need(path, rng, "seed", "rng.seed", &json::is_number_unsigned, "an integer") != m.seed ||
      needInteger(path, rng, "step", "rng.step") != m.step)
    fail(path, "has `rng.seed` and `rng.step` other than its `seed` and `step`");
  const json& data = need(path, j, "data", "data", &json::is_object, "an object");
  onlyFields(path, data, "data.", {"order", "next_step"});
  if (needString(path, data, "order", "data.order") != kDataOrder)
    fail(path, fmt::format("has `data.order` other than `{}`", kDataOrder));
  if (needInteger(path, data, "next_step", "data.next_step") != m.step)
    fail(path, "has `data.next_step` other than its `step`");
  if (need(path, j, "files", "files", &json::is_array, "a list") != json::array({kModelFile}))
    fail(path, fmt::format("lists other files than `{}`", kModelFile));
}

std::map<std::string, uint32_t> readChecksums(const std::string& path, const json& j) {
  std::map<std::string, uint32_t> out;
  for (const auto& [name, v] :
       need(path, j, "crc32", "crc32", &json::is_object, "an object").items()) {
    const std::string* hex = v.is_string() ? &v.get_ref<const std::string&>() : nullptr;
    if (!hex || hex->size() != 8 || hex->find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(path, fmt::format("has a `crc32` of tensor `{}` that is not 8 hex digits", name));
    out[name] = static_cast<uint32_t>(std::stoul(*hex, nullptr, 16));
  }
  return out;
}

} // namespace

std::string manifestText(const Manifest& m) {
  json crc = json::object();
  for (const auto& [name, v] : m.crc32)
    crc[name] = fmt::format("{:08x}", v);
  json j{{"format", kFormat},
         {"version", m.version},
         {"model", m.model},
         {"step", m.step},
         {"steps", m.steps},
         {"seed", m.seed},
         {"optimizer", m.optimizer},
         {"rng", {{"kind", kRngKind}, {"seed", m.seed}, {"step", m.step}}},
         {"data", {{"order", kDataOrder}, {"next_step", m.step}}},
         {"files", {kModelFile}},
         {"crc32", crc}};
  return j.dump(2) + "\n";
}

Manifest readManifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("cannot read `{}`", path));
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail(path, "is not a checkpoint manifest: it is not a JSON object");
  const std::string& format = needString(path, j, "format", "format");
  if (format != kFormat)
    fail(path, fmt::format("is not an EPL checkpoint manifest: its `format` is `{}`", format));
  Manifest m;
  m.version = readVersion(path, j);
  std::set<std::string> fields{"format",    "version", "model", "step", "seed",
                               "optimizer", "rng",     "data",  "files"};
  if (m.version >= 2) fields.insert("crc32");
  if (m.version >= 3) fields.insert("steps");
  onlyFields(path, j, "", fields);
  m.model = needString(path, j, "model", "model");
  m.optimizer = needString(path, j, "optimizer", "optimizer");
  m.step = needInteger(path, j, "step", "step");
  if (m.step < 0)
    fail(path, fmt::format("says `step` is {}, and a count of steps cannot be negative", m.step));
  m.seed = need(path, j, "seed", "seed", &json::is_number_unsigned, "a non-negative integer")
               .get<uint64_t>();
  if (m.version >= 3) {
    m.steps = needInteger(path, j, "steps", "steps");
    if (m.steps < 1)
      fail(path, fmt::format("says `steps` is {}, and a run has at least one step", m.steps));
  }
  checkRecords(path, j, m);
  if (m.version >= 2) m.crc32 = readChecksums(path, j);
  return m;
}

uint32_t crc32Of(const std::vector<unsigned char>& bytes) {
  return static_cast<uint32_t>(::crc32_z(0, bytes.data(), bytes.size()));
}

} // namespace epl::checkpoint
