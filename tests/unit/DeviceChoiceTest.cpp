// Which device a run takes (interp/DeviceChoice, docs/gpu.md): what `--device cuda` refuses
// before looking for a GPU, and `cpu` and `auto` where there is none; and which communicator
// the ranks' collectives on its memory take (backend::makeDeviceComm).
#include "Planned.h"

#include "backend/Device.h"
#include "backend/comm/Comm.h"
#include "interp/DeviceChoice.h"

#include <catch2/catch.hpp>
#include <cstdlib>

namespace {

// openDevice's error for `name`, or "" when it gave a device.
std::string refusal(const epl::ir::Module& m, const std::string& name) {
  epl::Session session;
  epl::Diagnostics& diags = session.diags;
  epl::interp::DeviceRequest r;
  r.name = name;
  std::string note;
  auto dev = epl::interp::openDevice(m, r, &note, diags);
  if (dev) return "";
  REQUIRE(!diags.all().empty());
  return diags.all().front().message;
}

} // namespace

TEST_CASE("device choice: cuda is refused with the reason before a GPU is looked for") {
  auto one = epl::testing::planned("one.epl", epl::testing::kOneStage, 1);
  REQUIRE(one);
  auto two = epl::testing::planned("one.epl", epl::testing::kOneStage, 2);
  REQUIRE(two);
  auto pipeline = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(pipeline);
  std::string split = R"(
model net(x: f32[B, 64], y: i32[B]) {
  split(2) {
    loss = cross_entropy(linear(relu(linear(x, 128)), 10), y)
  }
  return loss
}
train net {
  data = synthetic(samples = 64)
  batch = 16
}
)";
  auto splitPlan = epl::testing::planned("split.epl", split, 2);
  REQUIRE(splitPlan);
  // Optimizer states on disk run on GPUs too (their chunks copied to the device and back).
  std::string disk =
      std::string(epl::testing::kOneStage) + "policy { offload = optimizer\n offload_to = disk }\n";
  auto offloaded = epl::testing::planned("disk.epl", disk, 1);
  REQUIRE(offloaded);
  // Grouped-query attention with rotary embeddings and a padding mask, and mean and select,
  // have CUDA kernels too.
  std::string encoder = R"(
model net(tokens: i32[B, 8], keep: i32[B, 8], y: i32[B]) {
  x = embedding(tokens, 16, 32)
  x = x + attention(x, 4, causal = false, kv_heads = 2, rotary = true, mask = keep)
  return cross_entropy(linear(mean(x, 1) + select(x, 1, 0), 4), y)
}
train net {
  data = synthetic(samples = 64, classes = 4)
  batch = 16
}
)";
  auto encoderPlan = epl::testing::planned("encoder.epl", encoder, 1);
  REQUIRE(encoderPlan);
  // Data parallelism, pipelines, split regions, states on disk and those layers over GPUs
  // run: without a GPU here (or CUDA in this build) they are refused for that, never for
  // their plan.
  if (!epl::backend::cudaAvailable())
    for (const epl::ir::Module* m : {&*two, &*pipeline, &*splitPlan, &*offloaded, &*encoderPlan}) {
      std::string why = refusal(*m, "cuda");
      CHECK(!why.empty());
      CHECK(why.find("several GPUs") == std::string::npos);
      // A pipeline's send_recv and a split region's collectives are the executor's, no
      // kernels (a build without CUDA has none).
      if (epl::backend::deviceSupports("cuda", epl::ir::OpKind::Linear))
        CHECK(why.find("CUDA kernel") == std::string::npos);
    }
  // Without a GPU (as on CI), a plan the GPU path runs is refused for want of the GPU.
  if (!epl::backend::cudaAvailable()) CHECK(refusal(*one, "cuda").find("--device cuda: ") == 0);
}

TEST_CASE("device choice: cpu is the CPU, and auto the GPU only where one runs the plan") {
  auto one = epl::testing::planned("one.epl", epl::testing::kOneStage, 1);
  REQUIRE(one);
  epl::Session session;
  epl::Diagnostics& diags = session.diags;
  std::string note;
  epl::interp::DeviceRequest r;
  r.name = "cpu";
  auto cpu = epl::interp::openDevice(*one, r, &note, diags);
  REQUIRE(cpu);
  CHECK(cpu->hostAddressable());
  CHECK(note.empty());
  r.name = "auto";
  auto chosen = epl::interp::openDevice(*one, r, &note, diags);
  REQUIRE(chosen);
  CHECK(chosen->hostAddressable() == !epl::backend::cudaAvailable());
  CHECK(note.empty());
}

TEST_CASE("device choice: the ranks' communicator on a device whose memory is the host's") {
  auto world = epl::backend::makeLocalComms(2);
  auto cpu = epl::backend::makeCpuDevice(1);
  std::string note;
  // The CPU's memory is the host's: the world's communicator serves, nothing is wrapped.
  CHECK(epl::backend::makeDeviceComm(*world[0], *cpu, &note) == nullptr);
  CHECK(note.empty());
  // One rank needs none either.
  auto self = epl::backend::makeSelfComm();
  CHECK(epl::backend::makeDeviceComm(*self, *cpu, &note) == nullptr);
  // EPL_STAGED_COMM takes the path of ranks sharing a GPU, and says so.
  setenv("EPL_STAGED_COMM", "1", 1);
  auto staged = epl::backend::makeDeviceComm(*world[0], *cpu, &note);
  unsetenv("EPL_STAGED_COMM");
  REQUIRE(staged);
  CHECK(staged->name() == "local (host-staged)");
  CHECK(staged->size() == 2);
  CHECK(note == "note: EPL_STAGED_COMM is set: the ranks' collectives go through local, staged "
                "through host memory");
}
