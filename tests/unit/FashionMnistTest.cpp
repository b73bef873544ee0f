// Reads the real Fashion-MNIST files that Debian's dataset-fashion-mnist installs, and checks
// counts, labels and pixel sums against figures computed independently with Python's gzip
// module and numpy (tests/data/idx_oracle.py repeats that check pixel for pixel).
#include "interp/data/Dataset.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <numeric>

using namespace epl;
using namespace epl::data;

namespace {

const std::string kDir = "/usr/share/datasets/fashion-mnist/";

// Sum over the given images of round(pixel * 255), i.e. the raw byte values.
int64_t byteSum(const std::vector<float>& images) {
  int64_t sum = 0;
  for (float v : images)
    sum += std::lround(v * 255.0f);
  return sum;
}

} // namespace

TEST_CASE("Fashion-MNIST from the Debian package", "[data][fashion-mnist]") {
  if (!std::filesystem::exists(kDir + "train-images-idx3-ubyte.gz")) {
    WARN("skipped: " << kDir << " is missing (apt-get install dataset-fashion-mnist)");
    return;
  }
  ir::CallSpec spec{"idx",
                    {{"images", kDir + "train-images-idx3-ubyte.gz"},
                     {"labels", kDir + "train-labels-idx1-ubyte.gz"},
                     {"test_images", kDir + "t10k-images-idx3-ubyte.gz"},
                     {"test_labels", kDir + "t10k-labels-idx1-ubyte.gz"}},
                    {},
                    {}};
  std::vector<InputSpec> inputs = {{"images", ir::DType::F32, {1, 28, 28}},
                                   {"labels", ir::DType::I32, {}}};
  auto d = openDataset(spec, inputs, 0, "");
  REQUIRE(d->size(Split::Train) == 60000);
  REQUIRE(d->size(Split::Validation) == 10000);
  CHECK(d->maxLabel() == 9);
  CHECK(d->describe() == "idx: 60,000 train / 10,000 validation samples of 28 x 28");

  auto read = [&](Split s, int64_t first, int64_t count) {
    std::vector<int64_t> ids(static_cast<size_t>(count));
    std::iota(ids.begin(), ids.end(), first);
    std::pair<std::vector<float>, std::vector<int32_t>> out{std::vector<float>(ids.size() * 784),
                                                            std::vector<int32_t>(ids.size())};
    d->read(s, ids, {out.first.data(), out.second.data()}, nullptr);
    return out;
  };
  // Figures from numpy over the gzip module's bytes (values, not our code's output).
  auto head = read(Split::Train, 0, 10);
  CHECK(head.second == std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  CHECK(byteSum({head.first.begin(), head.first.begin() + 784}) == 76247);
  CHECK(head.first[14 * 28 + 14] == 217.0f / 255.0f);
  CHECK(byteSum(read(Split::Train, 59999, 1).first) == 16684);
  auto test = read(Split::Validation, 0, 10);
  CHECK(test.second == std::vector<int32_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  CHECK(byteSum({test.first.begin(), test.first.begin() + 784}) == 33456);
  CHECK(byteSum(read(Split::Validation, 9999, 1).first) == 24390);

  // Every pixel and label of both splits: totals and the class balance.
  int64_t trainPixels = 0, labelSum = 0;
  std::vector<int> perClass(10);
  for (int64_t first = 0; first < 60000; first += 10000) {
    auto chunk = read(Split::Train, first, 10000);
    trainPixels += byteSum(chunk.first);
    for (int32_t y : chunk.second) {
      labelSum += y;
      ++perClass[static_cast<size_t>(y)];
    }
  }
  CHECK(trainPixels == 3431114169);
  CHECK(labelSum == 270000);
  CHECK(perClass == std::vector<int>(10, 6000));
  CHECK(byteSum(read(Split::Validation, 0, 10000).first) == 573469082);
}
