// Checkpoint manifests: what EPL writes reads back, and a manifest that is damaged, from
// a newer EPL or inconsistent is rejected naming the file and the field. The first format
// (no checksums) still reads. (tests/training/checkpoints.sh checks the same end to end.)
#include "interp/checkpoint/Manifest.h"
#include "DataTestFiles.h"
#include "interp/checkpoint/AtomicFile.h"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

using namespace epl::checkpoint;
using Catch::Matchers::Contains;
using epl::testing::TempDir;
using nlohmann::json;

namespace {

Manifest sample() {
  Manifest m;
  m.model = "gpt";
  m.optimizer = "adamw";
  m.step = 123456789012;
  m.steps = 200000000000;
  m.seed = 9;
  m.crc32 = {{"linear.weight", 0x72f40261}, {"optimizer/exp_avg/linear.weight", 0}};
  return m;
}

// The sample manifest's JSON after `edit`, as a file; returns its path.
template <typename Edit> std::string written(const TempDir& dir, Edit edit) {
  json j = json::parse(manifestText(sample()));
  edit(j);
  std::string path = dir.file("manifest.json");
  epl::testing::writeBytes(path, j.dump());
  return path;
}

void expectRejected(const std::string& path, const std::string& part) {
  try {
    readManifest(path);
    FAIL("no error for " << part);
  } catch (const CheckpointError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Contains("`" + path + "`"));
    CHECK_THAT(e.what(), Contains(part));
  }
}

} // namespace

TEST_CASE("a manifest reads back as written", "[checkpoint][manifest]") {
  TempDir dir;
  Manifest m = readManifest(written(dir, [](json&) {}));
  CHECK(m.version == kManifestVersion);
  CHECK(m.model == "gpt");
  CHECK(m.optimizer == "adamw");
  CHECK(m.step == 123456789012);
  CHECK(m.steps == 200000000000);
  CHECK(m.seed == 9);
  CHECK(m.crc32 == sample().crc32);
  CHECK_THAT(manifestText(sample()), Contains("\"linear.weight\": \"72f40261\""));
}

TEST_CASE("a damaged or foreign manifest is rejected, naming the field", "[checkpoint][manifest]") {
  TempDir dir;
  expectRejected(written(dir, [](json& j) { j["format"] = "pt"; }), "its `format` is `pt`");
  expectRejected(written(dir, [](json& j) { j["version"] = 4; }), "format version 4");
  expectRejected(written(dir, [](json& j) { j["version"] = 0; }), "`version` 0");
  expectRejected(written(dir, [](json& j) { j["extra"] = 1; }), "unknown field `extra`");
  expectRejected(written(dir, [](json& j) { j["rng"]["extra"] = 1; }), "unknown field `rng.extra`");
  expectRejected(written(dir, [](json& j) { j.erase("model"); }), "has no `model`");
  expectRejected(written(dir, [](json& j) { j["step"] = "12"; }), "`step` that is not");
  expectRejected(written(dir, [](json& j) { j["step"] = -3; }), "`step` is -3");
  expectRejected(written(dir, [](json& j) { j["seed"] = -1; }), "`seed` that is not");
  expectRejected(written(dir, [](json& j) { j["rng"]["step"] = 5; }), "`rng.step`");
  expectRejected(written(dir, [](json& j) { j["data"]["next_step"] = 5; }), "`data.next_step`");
  expectRejected(written(dir, [](json& j) { j["files"] = {"a.bin"}; }), "other files");
  expectRejected(written(dir, [](json& j) { j["crc32"]["linear.weight"] = "xyz"; }),
                 "`crc32` of tensor `linear.weight`");
  expectRejected(written(dir, [](json& j) { j.erase("crc32"); }), "has no `crc32`");
  expectRejected(written(dir, [](json& j) { j.erase("steps"); }), "has no `steps`");
  expectRejected(written(dir, [](json& j) { j["steps"] = 0; }), "`steps` is 0");
  epl::testing::writeBytes(dir.file("manifest.json"), "{\"format\": ");
  expectRejected(dir.file("manifest.json"), "not a JSON object");
}

TEST_CASE("a manifest of the first format reads, without checksums", "[checkpoint][manifest]") {
  TempDir dir;
  Manifest m = readManifest(written(dir, [](json& j) {
    j["version"] = 1;
    j.erase("crc32");
    j.erase("steps");
  }));
  CHECK(m.version == 1);
  CHECK(m.crc32.empty());
  expectRejected(written(dir,
                         [](json& j) {
                           j["version"] = 1;
                           j.erase("steps");
                         }),
                 "unknown field `crc32`");
}

TEST_CASE("a manifest of the second format reads, without the run's steps",
          "[checkpoint][manifest]") {
  TempDir dir;
  Manifest m = readManifest(written(dir, [](json& j) {
    j["version"] = 2;
    j.erase("steps");
  }));
  CHECK(m.version == 2);
  CHECK(m.steps == 0);
  CHECK(m.crc32 == sample().crc32);
  expectRejected(written(dir, [](json& j) { j["version"] = 2; }), "unknown field `steps`");
}

TEST_CASE("CRC-32 is zlib's", "[checkpoint][manifest]") {
  std::string text = "123456789"; // the standard check value of CRC-32 is cbf43926
  CHECK(crc32Of({text.begin(), text.end()}) == 0xcbf43926u);
  CHECK(crc32Of({}) == 0);
}
