// A checkpoint's manifest.json on any bytes. Its checks live inside loadCheckpoint, which
// needs an Executor; readManifest below repeats them (parse from a stream, `step` an
// integer, `seed` read with a default). Point it at the reader's own function once the
// checks have one. A malformed manifest must be a CheckpointError; any other exception
// escapes and is a finding.
#include "interp/checkpoint/AtomicFile.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

struct Manifest {
  int64_t step = 0;
  uint64_t seed = 0;
};

Manifest readManifest(std::istream& in) {
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer())
    throw epl::checkpoint::CheckpointError("not a checkpoint manifest");
  return Manifest{j["step"].get<int64_t>(), j.value("seed", uint64_t{0})};
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    readManifest(in);
  } catch (const epl::checkpoint::CheckpointError&) {
  }
  return 0;
}
