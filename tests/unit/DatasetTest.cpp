// The data sources on small generated files: what each reads, and every error it reports,
// with the message naming the file.
#include "interp/data/Dataset.h"
#include "DataTestFiles.h"
#include "backend/cpu/Parallel.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <set>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace epl;
using namespace epl::data;
using Catch::Matchers::Contains;
using epl::testing::TempDir;

namespace {

ir::CallSpec call(std::string kind, std::map<std::string, std::string> strings,
                  std::map<std::string, double> numbers = {}) {
  return ir::CallSpec{std::move(kind), std::move(strings), std::move(numbers), {}};
}

// 12 images of 2 x 3 pixels (image i, pixel j holds 10 i + j) and labels i % 4.
constexpr uint32_t kImages = 12, kRows = 2, kCols = 3;
std::vector<uint8_t> pixels(uint32_t count) {
  std::vector<uint8_t> v;
  for (uint32_t i = 0; i < count; ++i)
    for (uint32_t j = 0; j < kRows * kCols; ++j)
      v.push_back(static_cast<uint8_t>(10 * i + j));
  return v;
}
std::vector<uint8_t> labels(uint32_t count) {
  std::vector<uint8_t> v;
  for (uint32_t i = 0; i < count; ++i)
    v.push_back(static_cast<uint8_t>(i % 4));
  return v;
}
std::string imageFile(uint32_t count = kImages) {
  return testing::idxBytes({count, kRows, kCols}, pixels(count));
}
std::string labelFile(uint32_t count = kImages) {
  return testing::idxBytes({count}, labels(count));
}

const std::vector<InputSpec> kClassifier = {{"images", ir::DType::F32, {1, kRows, kCols}},
                                            {"labels", ir::DType::I32, {}}};

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};
Batch readIdx(const Dataset& d, Split s, const std::vector<int64_t>& ids) {
  Batch b{std::vector<float>(ids.size() * kRows * kCols), std::vector<int32_t>(ids.size())};
  d.read(s, ids, {b.images.data(), b.labels.data()}, nullptr);
  return b;
}

// Opens `spec` expecting a DataError whose message contains each of `parts`.
void expectError(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                 const std::vector<std::string>& parts, const std::string& baseDir = "") {
  try {
    openDataset(spec, inputs, 0, baseDir);
    FAIL("no error for " << spec.kind);
  } catch (const DataError& e) {
    INFO(e.what());
    for (const auto& p : parts)
      CHECK_THAT(e.what(), Contains(p));
  }
}

} // namespace

TEST_CASE("idx reads plain files and keeps the last 10% for validation", "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("images"), imageFile());
  testing::writeBytes(dir.file("labels"), labelFile());
  auto d =
      openDataset(call("idx", {{"images", dir.file("images")}, {"labels", dir.file("labels")}}),
                  kClassifier, 0, "");
  CHECK(d->size(Split::Train) == 11);
  CHECK(d->size(Split::Validation) == 1);
  CHECK_FALSE(d->hasNextTokens());
  CHECK(d->maxToken() == -1);
  CHECK(d->maxLabel() == 3);
  CHECK(d->describe() == "idx: 11 train / 1 validation samples of 2 x 3 (validation: the last "
                         "10% of the training files)");

  Batch b = readIdx(*d, Split::Train, {5, 0});
  for (int j = 0; j < 6; ++j) {
    CHECK(b.images[j] == static_cast<float>(50 + j) / 255.0f);
    CHECK(b.images[6 + j] == static_cast<float>(j) / 255.0f);
  }
  CHECK(b.labels == std::vector<int32_t>{1, 0});
  Batch v = readIdx(*d, Split::Validation, {0}); // image 11
  CHECK(v.images[0] == 110.0f / 255.0f);
  CHECK(v.labels[0] == 3);
}

TEST_CASE("idx reads gzip files, the test pair as validation, paths relative to the script",
          "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("train-images.gz"), testing::gzipped(imageFile()));
  testing::writeBytes(dir.file("train-labels.gz"), testing::gzipped(labelFile()));
  testing::writeBytes(dir.file("test-images"), imageFile(5)); // plain and gzip mix
  testing::writeBytes(dir.file("test-labels.gz"), testing::gzipped(labelFile(5)));
  // Labels first: inputs are matched by kind, not position.
  std::vector<InputSpec> inputs = {{"y", ir::DType::I32, {}}, {"x", ir::DType::F32, {6}}};
  auto d = openDataset(call("idx", {{"images", "train-images.gz"},
                                    {"labels", "train-labels.gz"},
                                    {"test_images", "test-images"},
                                    {"test_labels", "test-labels.gz"}}),
                       inputs, 0, dir.path);
  CHECK(d->size(Split::Train) == 12);
  CHECK(d->size(Split::Validation) == 5);
  CHECK(d->describe() == "idx: 12 train / 5 validation samples of 2 x 3");
  std::vector<int32_t> y(2);
  std::vector<float> x(12);
  d->read(Split::Train, {11, 3}, {y.data(), x.data()}, nullptr);
  CHECK(y == std::vector<int32_t>{3, 3});
  CHECK(x[0] == 110.0f / 255.0f);
  CHECK(x[11] == 35.0f / 255.0f);
  d->read(Split::Validation, {4, 1}, {y.data(), x.data()}, nullptr);
  CHECK(y == std::vector<int32_t>{0, 1});
  CHECK(x[6] == 10.0f / 255.0f);
}

TEST_CASE("idx holds a large gzip's images whole, and reads samples from anywhere in them",
          "[data]") {
  // 30,000 images of 16 x 16 (7.7 MB: the content moves into memory of huge pages), pixel j
  // of image i holding (7 i + j) mod 256; read in an order that jumps about, as the sampler
  // reads them, more samples than the reads ask for ahead.
  constexpr uint32_t count = 30000, side = 16;
  std::vector<uint8_t> px(size_t{count} * side * side);
  for (size_t i = 0; i < count; ++i)
    for (size_t j = 0; j < side * side; ++j)
      px[i * side * side + j] = static_cast<uint8_t>((7 * i + j) % 256);
  std::vector<uint8_t> ys(count);
  for (uint32_t i = 0; i < count; ++i)
    ys[i] = static_cast<uint8_t>(i % 10);
  TempDir dir;
  testing::writeBytes(dir.file("images.gz"),
                      testing::gzipped(testing::idxBytes({count, side, side}, px)));
  testing::writeBytes(dir.file("labels.gz"), testing::gzipped(testing::idxBytes({count}, ys)));
  std::vector<InputSpec> inputs = {{"x", ir::DType::F32, {1, side, side}},
                                   {"y", ir::DType::I32, {}}};
  auto d = openDataset(call("idx", {{"images", "images.gz"}, {"labels", "labels.gz"}}), inputs, 0,
                       dir.path);
  std::vector<int64_t> ids;
  for (int64_t k = 0; k < 40; ++k)
    ids.push_back((k * 7919) % d->size(Split::Train));
  std::vector<float> x(ids.size() * side * side);
  std::vector<int32_t> y(ids.size());
  d->read(Split::Train, ids, {x.data(), y.data()}, nullptr);
  for (size_t k = 0; k < ids.size(); ++k) {
    auto i = static_cast<size_t>(ids[k]);
    CHECK(y[k] == static_cast<int32_t>(i % 10));
    for (size_t j = 0; j < side * side; ++j)
      if (x[k * side * side + j] != static_cast<float>((7 * i + j) % 256) / 255.0f)
        FAIL("sample " << i << ", pixel " << j);
  }
}

TEST_CASE("idx reads gzip data from a pipe, as from <(cat images.gz)", "[data]") {
  TempDir dir;
  // 200 images: more content than the largest header, so it is not all read at once.
  std::string gz = testing::gzipped(imageFile(200));
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  REQUIRE(write(fds[1], gz.data(), gz.size()) == static_cast<ssize_t>(gz.size()));
  close(fds[1]);
  testing::writeBytes(dir.file("labels"), labelFile(200));
  std::string images = "/proc/self/fd/" + std::to_string(fds[0]);
  std::unique_ptr<Dataset> d;
  CHECK_NOTHROW(d = openDataset(call("idx", {{"images", images}, {"labels", dir.file("labels")}}),
                                kClassifier, 0, ""));
  close(fds[0]);
  REQUIRE(d);
  CHECK(d->size(Split::Train) == 180);
}

TEST_CASE("idx accepts signed and wider label types", "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("images"), imageFile(2));
  std::string labels16 = testing::idxBytes({2}, {0x01, 0x02, 0x00, 0x07}, 0x0B);
  testing::writeBytes(dir.file("labels"), labels16);
  auto d = openDataset(call("idx", {{"images", dir.file("images")},
                                    {"labels", dir.file("labels")},
                                    {"test_images", dir.file("images")},
                                    {"test_labels", dir.file("labels")}}),
                       kClassifier, 0, "");
  Batch b = readIdx(*d, Split::Train, {0, 1});
  CHECK(b.labels == std::vector<int32_t>{258, 7});
  CHECK(d->maxLabel() == 258);
}

TEST_CASE("idx errors name the file and what is wrong", "[data]") {
  TempDir dir;
  std::string images = dir.file("images.gz"), labels = dir.file("labels");
  testing::writeBytes(images, testing::gzipped(imageFile()));
  testing::writeBytes(labels, labelFile());
  auto spec = [&](std::string img, std::string lab) {
    return call("idx", {{"images", img}, {"labels", lab}});
  };

  SECTION("missing file") {
    expectError(spec(dir.file("nope.gz"), labels), kClassifier,
                {"`" + dir.file("nope.gz") + "` does not exist"});
  }
  SECTION("a folder") {
    expectError(spec(dir.path, labels), kClassifier, {dir.path, "folder"});
  }
  SECTION("truncated gzip") {
    std::string gz = testing::gzipped(imageFile());
    testing::writeBytes(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
    expectError(spec(dir.file("cut.gz"), labels), kClassifier,
                {"`" + dir.file("cut.gz") + "` is truncated", "gzip"});
  }
  SECTION("corrupt gzip (bad checksum)") {
    std::string gz = testing::gzipped(imageFile());
    gz[gz.size() - 6] ^= 0x55; // inside the CRC-32 trailer
    testing::writeBytes(dir.file("bad.gz"), gz);
    expectError(spec(dir.file("bad.gz"), labels), kClassifier,
                {"`" + dir.file("bad.gz") + "` is corrupt", "incorrect data check"});
  }
  SECTION("garbage after the gzip stream") {
    testing::writeBytes(dir.file("tail.gz"), testing::gzipped(imageFile()) + "xyz");
    expectError(spec(dir.file("tail.gz"), labels), kClassifier,
                {"`" + dir.file("tail.gz") + "` has 3 bytes of trailing data"});
  }
  SECTION("labels given as images: wrong magic") {
    expectError(spec(labels, labels), kClassifier,
                {"`" + labels + "` is not an IDX image file: magic number 0x00000801"});
  }
  SECTION("not an IDX file at all") {
    testing::writeBytes(dir.file("png"), "\x89PNG\r\n\x1a\n");
    expectError(spec(images, dir.file("png")), kClassifier,
                {"`" + dir.file("png") + "` is not an IDX label file: magic number 0x89504e47"});
  }
  SECTION("short header") {
    testing::writeBytes(dir.file("short"), std::string("\0\0", 2));
    expectError(spec(dir.file("short"), labels), kClassifier,
                {"`" + dir.file("short") + "` is truncated: expected an IDX header"});
  }
  SECTION("truncated image data") {
    std::string bytes = imageFile();
    testing::writeBytes(dir.file("cut"), bytes.substr(0, 40));
    expectError(spec(dir.file("cut"), labels), kClassifier,
                {"`" + dir.file("cut") +
                 "` is truncated: expected 88 bytes for 12 images of 2 x 3, "
                 "got 40"});
  }
  SECTION("bytes after the data") {
    testing::writeBytes(dir.file("long"), labelFile() + "ab");
    expectError(spec(images, dir.file("long")), kClassifier,
                {"`" + dir.file("long") + "` has 2 bytes after its 12 labels"});
  }
  SECTION("count mismatch") {
    testing::writeBytes(dir.file("labels11"), labelFile(11));
    expectError(
        spec(images, dir.file("labels11")), kClassifier,
        {"`" + images + "` holds 12 images but `" + dir.file("labels11") + "` holds 11 labels"});
  }
  SECTION("negative label") {
    testing::writeBytes(dir.file("signed"),
                        testing::idxBytes({12}, {0, 1, 2, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}, 0x09));
    expectError(spec(images, dir.file("signed")), kClassifier,
                {"`" + dir.file("signed") + "` holds label -1 at index 3"});
  }
  SECTION("image size does not match the model input") {
    std::vector<InputSpec> wrong = {{"images", ir::DType::F32, {1, 28, 28}},
                                    {"labels", ir::DType::I32, {}}};
    expectError(spec(images, labels), wrong,
                {"model input `images: f32[B, 1, 28, 28]` holds 784 values per sample",
                 "`" + images + "` are 2 x 3 = 6"});
  }
  SECTION("wrong number of inputs") {
    expectError(spec(images, labels), {kClassifier[0]},
                {"`idx` data feeds two model inputs", "the model takes `images`"});
  }
  SECTION("two float inputs") {
    std::vector<InputSpec> wrong = {kClassifier[0], {"more", ir::DType::F32, {}}};
    expectError(spec(images, labels), wrong, {"`idx` data feeds two model inputs"});
  }
  SECTION("labels that are not scalars") {
    std::vector<InputSpec> wrong = {kClassifier[0], {"labels", ir::DType::I32, {4}}};
    expectError(spec(images, labels), wrong, {"`labels: i32[B, 4]` must hold one label"});
  }
  SECTION("half-precision images") {
    std::vector<InputSpec> wrong = {{"images", ir::DType::BF16, {6}}, kClassifier[1]};
    expectError(spec(images, labels), wrong, {"`images: bf16[B, 6]` is bf16", "as f32"});
  }
  SECTION("a test pair needs both files") {
    expectError(call("idx", {{"images", images}, {"labels", labels}, {"test_images", images}}),
                kClassifier, {"needs both `test_images` and `test_labels`"});
  }
  SECTION("a gzip bomb: inflating stops at what the header declares") {
    // 16 MiB of zeros after 12 images: about 16 KB of gzip.
    std::string bomb = imageFile() + std::string(size_t{16} << 20, '\0');
    testing::writeBytes(dir.file("bomb.gz"), testing::gzipped(bomb));
    expectError(spec(dir.file("bomb.gz"), labels), kClassifier,
                {"`" + dir.file("bomb.gz") +
                 "` holds more than the 88 bytes its header declares for 12 images of 2 x 3"});
  }
  SECTION("a gzip header that declares more than the memory") {
    std::string header = testing::idxBytes({0xffffffff, 256, 256}, std::vector<uint8_t>(2048));
    testing::writeBytes(dir.file("huge.gz"), testing::gzipped(header));
    expectError(spec(dir.file("huge.gz"), labels), kClassifier,
                {"`" + dir.file("huge.gz") +
                 "` declares 281 TB for 4,294,967,295 images of "
                 "256 x 256, more than this machine's memory"});
  }
  SECTION("test images of another size") {
    testing::writeBytes(dir.file("t-img"), testing::idxBytes({1, 3, 2}, {1, 2, 3, 4, 5, 6}));
    testing::writeBytes(dir.file("t-lab"), labelFile(1));
    expectError(call("idx", {{"images", images},
                             {"labels", labels},
                             {"test_images", dir.file("t-img")},
                             {"test_labels", dir.file("t-lab")}}),
                kClassifier, {"images in `" + dir.file("t-img") + "` are 3 x 2", "2 x 3"});
  }
}

namespace {

// A token file of n uint16 tokens: token i is (i * 7919) % 50000.
uint16_t tokenAt(int64_t i) {
  return static_cast<uint16_t>((i * 7919) % 50000);
}
std::string tokenFile(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    s += static_cast<char>(tokenAt(i) & 0xff);
    s += static_cast<char>(tokenAt(i) >> 8);
  }
  return s;
}
std::vector<InputSpec> tokenInput(int64_t seq) {
  return {{"tokens", ir::DType::I32, {seq}}};
}

} // namespace

TEST_CASE("tokens cuts the file into windows of seq + 1 with next-token targets", "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("corpus.bin"), tokenFile(1000));
  const int64_t seq = 16;
  auto d = openDataset(call("tokens", {{"path", "corpus.bin"}}, {{"seq", seq}}), tokenInput(seq), 0,
                       dir.path);
  // 900 training tokens give (900 - 1) / 16 = 56 windows, 100 validation tokens 6.
  CHECK(d->size(Split::Train) == 56);
  CHECK(d->size(Split::Validation) == 6);
  CHECK(d->hasNextTokens());
  int64_t maxToken = 0;
  for (int64_t i = 0; i < 1000; ++i)
    maxToken = std::max<int64_t>(maxToken, tokenAt(i));
  CHECK(d->maxToken() == maxToken);
  CHECK(d->describe() == "tokens: 1,000 tokens, 56 train / 6 validation windows of seq 16 + 1");

  std::vector<int32_t> in(2 * seq), next(2 * seq);
  d->read(Split::Train, {55, 0}, {in.data()}, next.data());
  for (int64_t t = 0; t < seq; ++t) {
    CHECK(in[t] == tokenAt(55 * seq + t));
    CHECK(next[t] == tokenAt(55 * seq + t + 1));
    CHECK(in[seq + t] == tokenAt(t));
    CHECK(next[seq + t] == tokenAt(t + 1));
  }
  CHECK(55 * seq + seq < 900); // the last training window stays in the training part
  d->read(Split::Validation, {5, 0}, {in.data()}, nullptr); // `next` may be null
  for (int64_t t = 0; t < seq; ++t) {
    CHECK(in[t] == tokenAt(900 + 5 * seq + t));
    CHECK(in[seq + t] == tokenAt(900 + t));
  }
}

TEST_CASE("tokens takes val_fraction, and 0 leaves no validation split", "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("c.bin"), tokenFile(101));
  auto d =
      openDataset(call("tokens", {{"path", dir.file("c.bin")}}, {{"seq", 10}, {"val_fraction", 0}}),
                  tokenInput(10), 0, "");
  CHECK(d->size(Split::Train) == 10);
  CHECK(d->size(Split::Validation) == 0);
  d = openDataset(
      call("tokens", {{"path", dir.file("c.bin")}}, {{"seq", 10}, {"val_fraction", 0.5}}),
      tokenInput(10), 0, "");
  CHECK(d->size(Split::Train) == 5);      // 51 tokens
  CHECK(d->size(Split::Validation) == 4); // 50 tokens
}

TEST_CASE("text reads bytes as tokens of vocab 256", "[data]") {
  TempDir dir;
  std::string text = "hello, world! \xff\x01 the quick brown fox jumps over the lazy dog";
  testing::writeBytes(dir.file("t.txt"), text);
  auto d = openDataset(call("text", {{"path", "t.txt"}}, {{"seq", 4}, {"val_fraction", 0}}),
                       tokenInput(4), 0, dir.path);
  CHECK(d->size(Split::Train) == static_cast<int64_t>(text.size() - 1) / 4);
  CHECK(d->maxToken() == 255);
  std::vector<int32_t> in(4), next(4);
  d->read(Split::Train, {3}, {in.data()}, next.data());
  CHECK(in == std::vector<int32_t>{'!', ' ', 255, 1}); // window 3 starts at byte 12
  CHECK(next == std::vector<int32_t>{' ', 255, 1, ' '});
}

TEST_CASE("text with a separator: a window of each line, padded, with its padding mask", "[data]") {
  TempDir dir;
  // Lines of 6, 1 (a lone separator: no window), 13 and 2 bytes, newlines included, then
  // "zz": the last 2 bytes (10%), the validation part.
  testing::writeBytes(dir.file("t.txt"), "hello\n\nthe long fox\nabzz");
  std::vector<InputSpec> inputs = {tokenInput(4)[0], {"mask", ir::DType::I32, {4}}};
  auto d =
      openDataset(call("text", {{"path", "t.txt"}}, {{"seq", 4}, {"separator", 10}, {"pad", 0}}),
                  inputs, 0, dir.path);
  // "hello\n": windows at 0 ("hello") and 4 ("o\n"); "\n": none; "the long fox\n" (13):
  // at 0, 4 and 8 (at 12 one token would be left); "ab" (the training part's end): 1.
  REQUIRE(d->size(Split::Train) == 6);
  CHECK(d->size(Split::Validation) == 1); // "zz"
  CHECK(d->describe() == "text: 24 tokens in 4 documents ending with token 10, 6 train / 1 "
                         "validation windows of at most seq 4 + 1, padded with token 0 (masks: "
                         "the second input)");
  std::vector<int32_t> in(4 * 6), mask(4 * 6), next(4 * 6);
  d->read(Split::Train, {0, 1, 2, 3, 4, 5}, {in.data(), mask.data()}, next.data());
  auto row = [](const std::vector<int32_t>& v, int r) {
    return std::vector<int32_t>(v.begin() + 4 * r, v.begin() + 4 * r + 4);
  };
  using V = std::vector<int32_t>;
  CHECK(row(in, 0) == V{'h', 'e', 'l', 'l'});
  CHECK(row(next, 0) == V{'e', 'l', 'l', 'o'});
  CHECK(row(mask, 0) == V{1, 1, 1, 1});
  CHECK(row(in, 1) == V{'o', '\n', 0, 0}); // the line's end, padded
  CHECK(row(next, 1) == V{'\n', 0, 0, 0});
  CHECK(row(mask, 1) == V{1, 1, 0, 0});
  CHECK(row(in, 4) == V{' ', 'f', 'o', 'x'});
  CHECK(row(next, 4) == V{'f', 'o', 'x', '\n'});
  CHECK(row(mask, 4) == V{1, 1, 1, 1});
  CHECK(row(in, 5) == V{'a', 'b', 0, 0}); // the last line lacks its newline
  CHECK(row(next, 5) == V{'b', 0, 0, 0});
  CHECK(row(mask, 5) == V{1, 1, 0, 0});
  d->read(Split::Validation, {0}, {in.data(), mask.data()}, next.data());
  CHECK(row(in, 0) == V{'z', 'z', 0, 0});
  CHECK(row(mask, 0) == V{1, 1, 0, 0});
  CHECK(d->maxValue(1) == 1); // the masks
  // Without a mask input, the same windows; pad 0 by default.
  auto plain = openDataset(call("text", {{"path", "t.txt"}}, {{"seq", 4}, {"separator", 10}}),
                           tokenInput(4), 0, dir.path);
  CHECK(plain->size(Split::Train) == 6);
  d->read(Split::Train, {1}, {in.data(), mask.data()}, nullptr);
  CHECK(row(in, 0) == V{'o', '\n', 0, 0});
}

TEST_CASE("textToTokens writes one uint16 per byte", "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("t.txt"), std::string("ab\xff\0z", 5));
  textToTokens(dir.file("t.txt"), dir.file("t.bin"));
  CHECK(testing::readBytes(dir.file("t.bin")) == std::string("a\0b\0\xff\0\0\0z\0", 10));
  // Converting again replaces the file.
  testing::writeBytes(dir.file("t.txt"), "c");
  textToTokens(dir.file("t.txt"), dir.file("t.bin"));
  CHECK(testing::readBytes(dir.file("t.bin")) == std::string("c\0", 2));
  CHECK_THROWS_WITH(textToTokens(dir.file("none.txt"), dir.file("x.bin")),
                    Contains("`" + dir.file("none.txt") + "` does not exist"));
  CHECK_THROWS_WITH(textToTokens(dir.file("t.txt"), dir.file("no/such/dir/x.bin")),
                    Contains(dir.file("no/such/dir/x.bin")));
  CHECK_THROWS_WITH(textToTokens(dir.file("t.txt"), dir.path),
                    Contains("`" + dir.path + "` is a folder"));
  CHECK_THROWS_WITH(textToTokens(dir.path, dir.file("x.bin")),
                    Contains("`" + dir.path + "` is a folder"));
}

TEST_CASE("textToTokens counts what it wrote, and no text is an error", "[data]") {
  TempDir dir;
  testing::writeBytes(dir.file("t.txt"), "hello");
  CHECK(textToTokens(dir.file("t.txt"), dir.file("t.bin")) == 5);
  testing::writeBytes(dir.file("empty.txt"), "");
  CHECK_THROWS_WITH(textToTokens(dir.file("empty.txt"), dir.file("x.bin")),
                    Contains("`" + dir.file("empty.txt") + "` is empty"));
  CHECK_THROWS_WITH(textToTokens("/dev/null", dir.file("x.bin")),
                    Contains("`/dev/null` is empty: there is no text to convert"));
  CHECK_FALSE(std::filesystem::exists(dir.file("x.bin")));
}

TEST_CASE("a pipe is read until it ends", "[data]") {
  TempDir dir;
  std::string fifo = dir.file("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // The writer blocks until the reader opens the pipe; joined before any check.
  std::thread writer([&] { testing::writeBytes(fifo, std::string(100, 'a')); });
  std::unique_ptr<Dataset> d;
  std::string error;
  try {
    d = openDataset(call("text", {{"path", fifo}}, {{"seq", 8}}), tokenInput(8), 0, "");
  } catch (const DataError& e) {
    error = e.what();
  }
  writer.join();
  REQUIRE(error.empty());
  CHECK(d->size(Split::Train) == 11); // 90 training tokens: (90 - 1) / 8 windows
}

TEST_CASE("token data errors name the file and what is wrong", "[data]") {
  TempDir dir;
  std::string path = dir.file("c.bin");
  testing::writeBytes(path, tokenFile(100));
  auto spec = [&](int64_t seq) { return call("tokens", {{"path", path}}, {{"seq", seq}}); };

  SECTION("odd byte count") {
    testing::writeBytes(path, tokenFile(100) + "x");
    expectError(spec(8), tokenInput(8), {"`" + path + "` has an odd number of bytes (201)"});
  }
  SECTION("too few tokens") {
    expectError(spec(90), tokenInput(90),
                {"`" + path +
                 "` holds 100 tokens, too few for one training window of seq + 1 = "
                 "91 tokens after the last 10% kept for validation"});
  }
  SECTION("missing file") {
    expectError(call("tokens", {{"path", "gone.bin"}}, {{"seq", 8}}), tokenInput(8),
                {"`" + dir.file("gone.bin") + "` does not exist"}, dir.path);
  }
  SECTION("unreadable file") {
    if (getuid() == 0) return; // root reads anything
    testing::writeBytes(dir.file("locked.bin"), tokenFile(100));
    std::filesystem::permissions(dir.file("locked.bin"), std::filesystem::perms::none);
    expectError(call("tokens", {{"path", dir.file("locked.bin")}}, {{"seq", 8}}), tokenInput(8),
                {"cannot read `" + dir.file("locked.bin") + "`: permission denied"});
  }
  SECTION("input of the wrong length") {
    expectError(spec(8), tokenInput(16),
                {"model input `tokens: i32[B, 16]` does not fit `tokens` data with seq = 8",
                 "`tokens: i32[B, 8]`"});
  }
  SECTION("float input") {
    expectError(spec(8), {{"tokens", ir::DType::F32, {8}}},
                {"model input `tokens: f32[B, 8]` does not fit"});
  }
  SECTION("two inputs") {
    expectError(spec(8), {tokenInput(8)[0], {"labels", ir::DType::I32, {}}},
                {"`tokens` data feeds a second model input, the padding masks, only when cut "
                 "into documents: give `separator`",
                 "`tokens`, `labels`"});
  }
  SECTION("three inputs") {
    expectError(call("tokens", {{"path", path}}, {{"seq", 8}, {"separator", 3}}),
                {tokenInput(8)[0], tokenInput(8)[0], tokenInput(8)[0]},
                {"`tokens` data feeds one model input, the token windows, and maybe their "
                 "padding masks"});
  }
  SECTION("a mask of the wrong shape") {
    expectError(call("tokens", {{"path", path}}, {{"seq", 8}, {"separator", 3}}),
                {tokenInput(8)[0], {"mask", ir::DType::I32, {4}}},
                {"model input `mask: i32[B, 4]` does not fit `tokens` data with seq = 8"});
  }
  SECTION("pad without separator, ids past the vocabulary") {
    expectError(call("text", {{"path", path}}, {{"seq", 8}, {"pad", 1}}), tokenInput(8),
                {"argument `pad` of `text` pads documents: give `separator` too"});
    expectError(call("text", {{"path", path}}, {{"seq", 8}, {"separator", 256}}), tokenInput(8),
                {"argument `separator` of `text` is a token id, below 256; got 256"});
  }
  SECTION("no document of two tokens") {
    testing::writeBytes(dir.file("t.txt"), std::string(10, '\n')); // empty lines
    expectError(call("text", {{"path", dir.file("t.txt")}}, {{"seq", 4}, {"separator", 10}}),
                tokenInput(4),
                {"`" + dir.file("t.txt") +
                 "` holds no document of two tokens or more (documents end with token 10) "
                 "before the last 10% kept for validation"});
  }
  SECTION("text too short") {
    testing::writeBytes(dir.file("t.txt"), "abc");
    expectError(call("text", {{"path", dir.file("t.txt")}}, {{"seq", 3}}), tokenInput(3),
                {"`" + dir.file("t.txt") + "` holds 3 tokens, too few"});
  }
  SECTION("val_fraction out of range") {
    expectError(call("tokens", {{"path", path}}, {{"seq", 8}, {"val_fraction", 1}}), tokenInput(8),
                {"`val_fraction` of `tokens` must be in [0, 1)"});
  }
  SECTION("unknown source") {
    expectError(call("parquet", {}), tokenInput(8), {"unknown data source `parquet`"});
  }
}

TEST_CASE("a synthetic batch is the same read on one thread or several", "[data]") {
  // 64 samples of 1 x 28 x 28: the pool's threads take runs of 8192 elements, which cut
  // samples in the middle.
  std::vector<InputSpec> inputs = {{"x", ir::DType::F32, {1, 28, 28}}, {"y", ir::DType::I32, {}}};
  auto d = openDataset(call("synthetic", {}, {{"samples", 1000}}), inputs, 42, "");
  std::vector<int64_t> ids(64);
  std::iota(ids.begin(), ids.end(), 100);
  int before = backend::cpu::threadCount();
  auto read = [&](int threads) {
    backend::cpu::setThreads(threads);
    std::pair<std::vector<float>, std::vector<int32_t>> out{std::vector<float>(784 * 64),
                                                            std::vector<int32_t>(64)};
    d->read(Split::Train, ids, {out.first.data(), out.second.data()}, nullptr);
    return out;
  };
  auto one = read(1), two = read(2), three = read(3);
  backend::cpu::setThreads(before);
  CHECK(one == two);
  CHECK(one == three);
  // A batch's first sample is that sample read alone.
  std::pair<std::vector<float>, std::vector<int32_t>> alone{std::vector<float>(784),
                                                            std::vector<int32_t>(1)};
  d->read(Split::Train, {100}, {alone.first.data(), alone.second.data()}, nullptr);
  CHECK(std::vector<float>(one.first.begin(), one.first.begin() + 784) == alone.first);
}

TEST_CASE("synthetic samples are a pure function of seed and id", "[data]") {
  std::vector<InputSpec> inputs = {{"x", ir::DType::F32, {3, 4}}, {"y", ir::DType::I32, {}}};
  auto d = openDataset(call("synthetic", {}, {{"samples", 1000}, {"classes", 7}}), inputs, 42, "");
  CHECK(d->size(Split::Train) == 1000);
  CHECK(d->size(Split::Validation) == 100);
  CHECK_FALSE(d->hasNextTokens());
  CHECK(d->maxLabel() == 6);
  CHECK(d->describe() == "synthetic: 1,000 train / 100 validation samples, seed 42, 7 classes");

  auto read = [&](const Dataset& ds, Split s, const std::vector<int64_t>& ids) {
    std::pair<std::vector<float>, std::vector<int32_t>> out{std::vector<float>(12 * ids.size()),
                                                            std::vector<int32_t>(ids.size())};
    ds.read(s, ids, {out.first.data(), out.second.data()}, nullptr);
    return out;
  };
  auto both = read(*d, Split::Train, {7, 3});
  auto seven = read(*d, Split::Train, {7});
  auto three = read(*d, Split::Train, {3});
  CHECK(std::vector<float>(both.first.begin(), both.first.begin() + 12) == seven.first);
  CHECK(std::vector<float>(both.first.begin() + 12, both.first.end()) == three.first);
  CHECK(both.second == std::vector<int32_t>{seven.second[0], three.second[0]});

  // Validation samples are others; another seed gives other values.
  CHECK(read(*d, Split::Validation, {7}).first != seven.first);
  auto other =
      openDataset(call("synthetic", {}, {{"samples", 1000}, {"classes", 7}}), inputs, 43, "");
  CHECK(read(*other, Split::Train, {7}).first != seven.first);

  // Roughly N(0, 1) and uniform over the classes.
  std::vector<int64_t> all(1000);
  std::iota(all.begin(), all.end(), 0);
  auto data = read(*d, Split::Train, all);
  double sum = 0, sq = 0;
  for (float v : data.first) {
    sum += v;
    sq += double(v) * v;
  }
  double n = static_cast<double>(data.first.size()), mean = sum / n;
  CHECK(std::abs(mean) < 0.05);
  CHECK(std::abs(sq / n - mean * mean - 1) < 0.05);
  std::vector<int> counts(7);
  for (int32_t y : data.second) {
    REQUIRE(y >= 0);
    REQUIRE(y < 7);
    ++counts[static_cast<size_t>(y)];
  }
  for (int c : counts)
    CHECK(c > 100);
}

TEST_CASE("synthetic draws each integer input from what the layers reading it accept", "[data]") {
  // A token input read by a 256-word embedding, a segment input by a 2-word one, labels by
  // a 4-class loss: `classes` (10) caps them all, the readers cap the last two.
  std::vector<InputSpec> inputs = {{"tokens", ir::DType::I32, {8}, 256},
                                   {"segments", ir::DType::I32, {8}, 2},
                                   {"labels", ir::DType::I32, {}, 4}};
  auto d = openDataset(call("synthetic", {}, {{"samples", 200}}), inputs, 5, "");
  CHECK(d->maxValue(0) == 9);
  CHECK(d->maxValue(1) == 1);
  CHECK(d->maxValue(2) == 3);
  CHECK(d->describe() == "synthetic: 200 train / 20 validation samples, seed 5, 10 classes "
                         "(`segments` below 2, `labels` below 4: what the layers reading them "
                         "accept)");
  std::vector<int64_t> ids(200);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<int32_t> tokens(8 * 200), segments(8 * 200), labels(200);
  d->read(Split::Train, ids, {tokens.data(), segments.data(), labels.data()}, nullptr);
  CHECK(*std::max_element(tokens.begin(), tokens.end()) == 9);
  CHECK(*std::max_element(segments.begin(), segments.end()) == 1);
  CHECK(*std::min_element(segments.begin(), segments.end()) == 0);
  CHECK(*std::max_element(labels.begin(), labels.end()) == 3);
}

TEST_CASE("synthetic gives next-token targets to a sequence input", "[data]") {
  auto d = openDataset(call("synthetic", {}, {{"samples", 10}}), tokenInput(5), 1, "");
  CHECK(d->hasNextTokens());
  CHECK(d->maxToken() == 9); // classes default to 10
  CHECK(d->size(Split::Validation) == 1);
  std::vector<int32_t> in(10), next(10);
  d->read(Split::Train, {2, 9}, {in.data()}, next.data());
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t + 1 < 5; ++t)
      CHECK(next[s * 5 + t] == in[s * 5 + t + 1]);
  for (int32_t v : next) {
    CHECK(v >= 0);
    CHECK(v < 10);
  }
}

TEST_CASE("synthetic errors", "[data]") {
  expectError(call("synthetic", {}, {{"samples", 10}}), {}, {"needs a model input"});
  expectError(call("synthetic", {}, {{"samples", 10}}), {{"x", ir::DType::I64, {}}},
              {"model input `x: i64[B]` is i64", "as i32"});
  expectError(call("synthetic", {}, {}), tokenInput(4), {"`synthetic` needs `samples`"});
  expectError(call("synthetic", {}, {{"samples", 2.5}}), tokenInput(4),
              {"argument `samples` of `synthetic` must be an integer >= 1, got 2.5"});
}
