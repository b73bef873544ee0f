// Optimizer states in a file: reads and writes, the step's stream of chunks through three
// staging buffers (read ahead, updated, written back), the gathers' parts of the
// parameters read ahead, and a folder it cannot use.
#include "interp/OffloadedStates.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

namespace fs = std::filesystem;
using epl::interp::OffloadedStates;

namespace {

// A fresh folder under the temporary one, removed after the test.
struct Folder {
  fs::path path;
  Folder() {
    std::string t = (fs::temp_directory_path() / "epl-offload-test-XXXXXX").string();
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~Folder() { fs::remove_all(path); }
};

struct Staging {
  std::vector<std::vector<unsigned char>> memory;
  std::vector<unsigned char*> pointers;
  Staging(int states, int64_t chunk) {
    for (int b = 0; b < 3; ++b) {
      memory.emplace_back(static_cast<size_t>(states * chunk));
      pointers.push_back(memory.back().data());
    }
  }
};

} // namespace

TEST_CASE("offloaded states start at zero and read back what was written and leave no file") {
  Folder dir;
  Staging staging(2, 64);
  OffloadedStates states(dir.path.string(), 2, 4096, staging.pointers, 64);
  CHECK(fs::is_empty(dir.path)); // removed from the folder once open
  std::vector<float> zeros(1024, 1.f);
  states.read(1, 0, 4096, zeros.data());
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float v) { return v == 0.f; }));
  std::vector<float> data(100);
  std::iota(data.begin(), data.end(), 1.f);
  states.write(1, 400, 400, data.data());
  std::vector<float> back(100);
  states.read(1, 400, 400, back.data());
  CHECK(back == data);
  states.read(0, 400, 400, back.data()); // another state's block is untouched
  CHECK(back == std::vector<float>(100, 0.f));
}

namespace {

// Three steps of an update that adds k + 1 to each element of state k, streamed in chunks of
// uneven sizes (at most `chunk`) over `bytes` of each of two states.
void streamSteps(OffloadedStates& states, int64_t chunk, int64_t bytes) {
  // Chunks of uneven sizes that cover the states once, as an optimizer's parameters do.
  std::vector<OffloadedStates::Chunk> chunks;
  for (int64_t at = 0; at < bytes;) {
    int64_t n = std::min<int64_t>(at % 3 == 0 ? chunk : chunk / 2, bytes - at);
    chunks.push_back({at, n});
    at += n;
  }
  REQUIRE(chunks.size() > 6);
  states.setChunks(chunks);
  for (int step = 1; step <= 3; ++step) {
    INFO("step " << step);
    states.beginStep();
    for (size_t i = 0; i < chunks.size(); ++i) {
      states.acquire(i);
      for (int k = 0; k < 2; ++k) {
        auto* v = reinterpret_cast<float*>(states.stateOf(i, k));
        for (int64_t e = 0; e < chunks[i].bytes / 4; ++e) {
          // Each element counts the steps that updated it: what the step before wrote back.
          REQUIRE(v[e] == static_cast<float>((step - 1) * (k + 1)));
          v[e] += static_cast<float>(k + 1);
        }
      }
      states.release(i);
    }
    states.endStep();
  }
  std::vector<float> all(static_cast<size_t>(bytes / 4));
  states.read(1, 0, bytes, all.data());
  CHECK(std::all_of(all.begin(), all.end(), [](float v) { return v == 6.f; }));
}

} // namespace

TEST_CASE("a step streams its chunks in order through three staging buffers") {
  Folder dir;
  const int64_t chunk = 256; // bytes of each state
  Staging staging(2, chunk);
  const int64_t bytes = 10 * chunk + 128;
  OffloadedStates states(dir.path.string(), 2, bytes, staging.pointers, chunk);
  streamSteps(states, chunk, bytes);
}

TEST_CASE("states in host memory (offload_to = cpu) stream as a file's do") {
  const int64_t chunk = 256, bytes = 10 * chunk + 128;
  Staging staging(2, chunk);
  std::vector<unsigned char> memory(static_cast<size_t>(2 * bytes), 0);
  OffloadedStates states(memory.data(), 2, bytes, staging.pointers, chunk);
  CHECK(states.dir() == "host memory");
  streamSteps(states, chunk, bytes);
  // What the stream wrote back is in that memory: state 1 at its block, 2 a step.
  float v = 0;
  std::memcpy(&v, memory.data() + bytes + 4, 4);
  CHECK(v == 6.f);
}

// offload = params: the gathers' parts of the parameters' block are read ahead, one at a
// time, before the step's optimizer chunks update the block and write it back.
TEST_CASE("a step's parts are read ahead in order and see the last step's update") {
  Folder dir;
  const int64_t chunk = 256;
  Staging staging(3, chunk); // two states and the parameters' block
  const int64_t bytes = 8 * chunk;
  OffloadedStates states(dir.path.string(), 3, bytes, staging.pointers, chunk);
  std::vector<OffloadedStates::Chunk> chunks;
  for (int64_t at = 0; at < bytes; at += chunk)
    chunks.push_back({at, chunk});
  states.setChunks(chunks);
  // Parts of uneven sizes, out of the block's order, one read twice (a forward's gather
  // and a backward's).
  std::vector<OffloadedStates::Part> parts = {
      {5 * chunk, 3 * chunk}, {0, 2 * chunk}, {2 * chunk + 64, 512}, {5 * chunk, 3 * chunk}};
  std::vector<unsigned char> buffer(3 * chunk);
  states.setParts(2, parts, buffer.data());
  std::vector<float> start(static_cast<size_t>(bytes / 4)); // each float its index
  std::iota(start.begin(), start.end(), 0.f);
  states.write(2, 0, bytes, start.data());
  for (int step = 1; step <= 3; ++step) {
    INFO("step " << step);
    states.beginStep();
    for (size_t j = 0; j < parts.size(); ++j) {
      auto* v = reinterpret_cast<const float*>(states.acquirePart(j));
      REQUIRE(v == reinterpret_cast<const float*>(buffer.data()));
      for (int64_t e = 0; e < parts[j].bytes / 4; ++e) // its place, and the steps before
        REQUIRE(v[e] == static_cast<float>(parts[j].offset / 4 + e + step - 1));
      states.releasePart(j);
    }
    for (size_t i = 0; i < chunks.size(); ++i) { // the optimizer adds 1 to the parameters
      states.acquire(i);
      auto* v = reinterpret_cast<float*>(states.stateOf(i, 2));
      for (int64_t e = 0; e < chunk / 4; ++e)
        v[e] += 1.f;
      states.release(i);
    }
    states.endStep();
  }
}

TEST_CASE("a folder that cannot hold the states is an error naming it") {
  Staging staging(1, 64);
  try {
    OffloadedStates states("/nonexistent-epl-folder", 1, 1024, staging.pointers, 64);
    FAIL("no error");
  } catch (const epl::interp::OffloadError& e) {
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent-epl-folder"));
    CHECK_THAT(e.what(), Catch::Contains("No such file or directory"));
  }
}
