// `epl plan --json` against the module it describes: the mesh, every rank in exactly one
// stage group, each stage's layers adding up to its parameters, one entry a bridge and a
// bucket, the schedule's simulation, and each rank's ledger adding up to its peak.
#include "ir/PlanJson.h"
#include "Planned.h"
#include "ir/PipelineSchedule.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

namespace {

const char* kPlanScript = R"(
model net(x: f32[B, 64], y: i32[B]) {
  replicate {
    h = relu(linear(x, 128))
  }
  replicate {
    h = relu(linear(h, 128))
    split(2) {
      loss = cross_entropy(linear(h, 10), y)
    }
  }
  return loss
}
policy { micro_batches = 4 zero = 1 }
train net {
  data = synthetic(samples = 64)
  batch = 16
  optimizer = adam(lr = 1e-3)
}
)";

// Every key of `j` and of the objects inside it, arrays' elements included.
void collectKeys(const nlohmann::json& j, std::set<std::string>& keys) {
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) {
      keys.insert(it.key());
      collectKeys(it.value(), keys);
    }
  if (j.is_array())
    for (const auto& e : j)
      collectKeys(e, keys);
}

} // namespace

TEST_CASE("docs/plan-json.md describes every field of the plan's JSON") {
  auto m = epl::testing::planned("net.epl", kPlanScript, 8);
  REQUIRE(m);
  std::set<std::string> keys;
  collectKeys(nlohmann::json::parse(epl::ir::planJson(*m).dump()), keys);
  std::ifstream in(std::string(EPL_SOURCE_DIR) + "/docs/plan-json.md");
  std::stringstream doc;
  doc << in.rdbuf();
  REQUIRE(keys.size() > 40);
  for (const std::string& key : keys) {
    CAPTURE(key);
    bool named = doc.str().find("`" + key + "`") != std::string::npos ||
                 doc.str().find("`" + key + "[]`") != std::string::npos; // an array
    CHECK(named);
  }
}

TEST_CASE("the plan as JSON carries the module's figures") {
  auto m = epl::testing::planned("net.epl", kPlanScript, 8);
  REQUIRE(m);
  // Printed and read back: what `epl plan --json` writes is JSON.
  std::ostringstream text;
  epl::ir::printPlanJson(*m, text);
  nlohmann::json j = nlohmann::json::parse(text.str());

  CHECK(j["schema"] == epl::ir::kPlanJsonSchema);
  CHECK(j["model"] == "net");
  CHECK(j["np"] == 8);
  CHECK(j["mesh"]["data_parallel"] == m->mesh.dataParallel);
  CHECK(j["mesh"]["stages"] == 2);
  CHECK(j["mesh"]["split"] == 2);
  CHECK(j["batch"]["global"] == 16);
  CHECK(j["batch"]["micro_batches"] == 4);
  CHECK(j["policy"]["zero"] == 1);
  CHECK(j["policy"]["optimizer"] == "adam");

  // Every rank in one stage group of one replica; each stage's layers add up to its
  // parameters, and the stages' to the model's.
  std::multiset<int> ranks;
  int64_t params = 0;
  for (size_t s = 0; s < 2; ++s) {
    const nlohmann::json& st = j["stages"][s];
    CHECK(st["devices"] == m->mesh.stages[s].group);
    for (const auto& group : st["ranks"])
      for (const auto& r : group)
        ranks.insert(r.get<int>());
    int64_t layers = 0;
    for (const auto& layer : st["layers"]) {
      CHECK(layer["bytes"] == 4 * layer["params"].get<int64_t>());
      layers += layer["params"].get<int64_t>();
    }
    CHECK(layers == st["params"]["count"].get<int64_t>());
    params += layers;
  }
  CHECK(params == j["params"]["count"].get<int64_t>());
  CHECK(ranks == std::multiset<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(j["stages"][0]["split_ops"].empty());
  REQUIRE(j["stages"][1]["split_ops"].size() == 2); // the head's columns, the loss's vocab
  CHECK(j["stages"][1]["split_ops"][0]["form"] == "column");
  CHECK(j["stages"][1]["split_ops"][1]["form"] == "vocab");

  CHECK(j["bridges"].size() == m->bridges.size());
  CHECK(j["bridges"][0]["what"] == "send/recv");
  CHECK(j["gradient_buckets"].size() == m->buckets.size());

  epl::ir::ScheduleSimulation sim = epl::ir::simulateSchedule(m->policy.schedule, {2, 4, 1});
  CHECK(j["schedule"]["name"] == "1f1b");
  CHECK(j["schedule"]["bubble"] == sim.bubble);
  CHECK(j["schedule"]["peak_in_flight"] == sim.peakInFlight);

  // One entry a rank, its ledger adding up to its peak.
  REQUIRE(j["ranks"].size() == 8);
  for (const auto& r : j["ranks"]) {
    const epl::ir::Program& p = m->programs.at(r["rank"].get<size_t>());
    const nlohmann::json& mem = r["memory"];
    CHECK(r["stage"] == p.stage);
    CHECK(mem["peak"] == p.peakBytes());
    int64_t sum = 0;
    for (const char* part :
         {"activations", "params", "grads", "optimizer", "staging", "comm_buffers", "host_inputs"})
      sum += mem[part].get<int64_t>();
    CHECK(sum == mem["peak"].get<int64_t>());
  }
}

TEST_CASE("a plan of one stage has no schedule in JSON") {
  auto m = epl::testing::planned("mlp.epl", epl::testing::kOneStage, 2);
  REQUIRE(m);
  nlohmann::ordered_json j = epl::ir::planJson(*m);
  CHECK(j["schedule"].is_null());
  CHECK(j["stages"].size() == 1);
  CHECK(j["bridges"].empty());
  CHECK(j["ranks"].size() == 2);
}
