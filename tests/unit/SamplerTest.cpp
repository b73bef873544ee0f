// The seeded sample order: a permutation per epoch, deterministic, and stateless across
// epoch boundaries (what a resumed run relies on).
#include "interp/data/Dataset.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

using namespace epl::data;

namespace {

std::vector<int64_t> epoch(const Sampler& s, int64_t size, int64_t e) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size; ++i)
    out.push_back(s.sampleAt(e * size + i));
  return out;
}

bool isPermutation(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int64_t>(i)) return false;
  return true;
}

} // namespace

TEST_CASE("each epoch is a permutation of the samples", "[data][sampler]") {
  for (int64_t size : {1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 60000}) {
    Sampler s(size, 3);
    for (int64_t e = 0; e < 3; ++e) {
      INFO("size " << size << ", epoch " << e);
      CHECK(isPermutation(epoch(s, size, e)));
    }
  }
}

TEST_CASE("the order depends on seed and epoch, and only on them", "[data][sampler]") {
  const int64_t size = 1000;
  Sampler a(size, 7), b(size, 7), c(size, 8);
  CHECK(epoch(a, size, 0) == epoch(b, size, 0));
  CHECK(epoch(a, size, 0) != epoch(c, size, 0));
  CHECK(epoch(a, size, 0) != epoch(a, size, 1));
  std::vector<int64_t> identity(size);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(epoch(a, size, 0) != identity);
  // Shuffled, not shifted: few samples keep their place.
  auto e0 = epoch(a, size, 0);
  int fixed = 0;
  for (int64_t i = 0; i < size; ++i)
    fixed += e0[i] == i;
  CHECK(fixed < 10);
}

TEST_CASE("global batches follow positions across the epoch boundary", "[data][sampler]") {
  const int64_t size = 10, batch = 4;
  Sampler s(size, 1);
  // Step 2 covers positions 8..11: the last two of epoch 0, the first two of epoch 1.
  auto b2 = s.globalBatch(2, batch);
  auto e0 = epoch(s, size, 0), e1 = epoch(s, size, 1);
  CHECK(b2 == std::vector<int64_t>{e0[8], e0[9], e1[0], e1[1]});
  CHECK(s.epochOf(2, batch) == 0);
  CHECK(s.epochOf(3, batch) == 1);
  CHECK(s.epochOf(5, batch) == 2);
  // A sampler built afresh (a resumed run) gives the same batch for the same step.
  CHECK(Sampler(size, 1).globalBatch(2, batch) == b2);
}

TEST_CASE("every sample is seen once per epoch over consecutive batches", "[data][sampler]") {
  const int64_t size = 100, batch = 7;
  Sampler s(size, 11);
  std::vector<std::vector<int64_t>> seen(4);
  for (int64_t step = 0; step * batch < 4 * size; ++step) {
    auto ids = s.globalBatch(step, batch);
    for (int64_t i = 0; i < batch; ++i) {
      int64_t position = step * batch + i;
      if (position < 4 * size) seen[position / size].push_back(ids[i]);
    }
  }
  for (const auto& e : seen)
    CHECK(isPermutation(e));
}

TEST_CASE("a sampler needs samples", "[data][sampler]") {
  CHECK_THROWS_AS(Sampler(0, 1), DataError);
}
