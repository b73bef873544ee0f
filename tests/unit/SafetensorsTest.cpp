// Safetensors checkpoint files: a round trip, the layout the format prescribes, atomic
// replacement, and every kind of corrupt file the reader must reject, naming the file.
// (tests/checkpoint/torch_interop.py checks the same files against PyTorch.)
#include "interp/checkpoint/Safetensors.h"
#include "DataTestFiles.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

using namespace epl;
using namespace epl::checkpoint;
using Catch::Matchers::Contains;
using epl::testing::TempDir;

namespace {

template <typename T> std::vector<unsigned char> bytesOf(const std::vector<T>& values) {
  std::vector<unsigned char> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<TensorRecord> sampleTensors() {
  return {
      {"layers.0.weight", ir::DType::F32, {2, 3}, bytesOf<float>({1, -2, 3.5f, 0, 1e-30f, 7})},
      {"step", ir::DType::I64, {}, bytesOf<int64_t>({123456789012})},
      {"ids", ir::DType::I32, {3}, bytesOf<int32_t>({-1, 0, 2147483647})},
      {"half", ir::DType::F16, {2}, bytesOf<uint16_t>({0x3c00, 0xc100})},
      {"brain", ir::DType::BF16, {1, 2}, bytesOf<uint16_t>({0x3f80, 0x4049})},
      {"rng", TensorDType::u8(), {4}, {0, 1, 128, 255}},
      {"empty", ir::DType::F32, {0, 4}, {}},
  };
}

std::string littleEndian64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i)
    s += static_cast<char>(v >> (8 * i));
  return s;
}

// A file made by hand: the length, `header` as given, then `data`.
std::string rawFile(const std::string& header, const std::string& data) {
  return littleEndian64(header.size()) + header + data;
}

void expectReadError(const std::string& path, const std::string& part) {
  try {
    readSafetensors(path);
    FAIL("no error reading " << path);
  } catch (const CheckpointError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Contains("`" + path + "`"));
    CHECK_THAT(e.what(), Contains(part));
  }
}

size_t filesIn(const std::string& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

} // namespace

TEST_CASE("safetensors round trip keeps names, order, dtypes, shapes, bytes, metadata",
          "[checkpoint]") {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors");
  auto tensors = sampleTensors();
  std::map<std::string, std::string> meta = {{"step", "42"}, {"note", "ünïcode \"quoted\""}};
  writeSafetensors(path, tensors, meta);

  std::map<std::string, std::string> readMeta;
  auto back = readSafetensors(path, &readMeta);
  CHECK(readMeta == meta);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < back.size(); ++i) {
    INFO(tensors[i].name);
    CHECK(back[i].name == tensors[i].name);
    CHECK(back[i].dtype == tensors[i].dtype);
    CHECK(back[i].shape == tensors[i].shape);
    CHECK(back[i].bytes == tensors[i].bytes);
  }
  CHECK(back[5].dtype.isU8());
  CHECK(back[1].dtype.irDType() == ir::DType::I64);
  CHECK(back[1].numElements() == 1);

  // The layout: an 8-byte length, a JSON header padded to 8, then the data.
  std::string file = testing::readBytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = n << 8 | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  CHECK((8 + n) % 8 == 0);
  CHECK(file[8] == '{');
  size_t dataBytes = 0;
  for (const auto& t : tensors)
    dataBytes += t.bytes.size();
  CHECK(file.size() == 8 + n + dataBytes);
  CHECK_THAT(file.substr(8, n), Contains("\"layers.0.weight\":{\"data_offsets\":[0,24],"
                                         "\"dtype\":\"F32\",\"shape\":[2,3]}"));
}

TEST_CASE("safetensors without metadata has no __metadata__ entry", "[checkpoint]") {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  writeSafetensors(path, {}, {});
  CHECK(testing::readBytes(path) == littleEndian64(8) + "{}      ");
  std::map<std::string, std::string> meta = {{"stale", "x"}};
  CHECK(readSafetensors(path, &meta).empty());
  CHECK(meta.empty());
}

TEST_CASE("safetensors writes replace the file atomically", "[checkpoint]") {
  TempDir dir;
  std::string path = dir.file("c.safetensors");
  writeSafetensors(path, sampleTensors(), {});
  std::string before = testing::readBytes(path);

  SECTION("a rejected write leaves the old file and no temporary") {
    auto bad = sampleTensors();
    bad[0].bytes.pop_back();
    CHECK_THROWS_WITH(writeSafetensors(path, bad, {}),
                      Contains("cannot write `" + path +
                               "`: tensor `layers.0.weight` of F32 [2, 3] holds 23 bytes"));
    CHECK(testing::readBytes(path) == before);
    CHECK(filesIn(dir.path) == 1);
  }
  SECTION("an abandoned writer leaves the old file and no temporary") {
    {
      AtomicFileWriter w(path);
      w.write("partial", 7);
    }
    CHECK(testing::readBytes(path) == before);
    CHECK(filesIn(dir.path) == 1);
  }
  SECTION("a committed write replaces it") {
    writeSafetensors(path, {sampleTensors()[1]}, {{"k", "v"}});
    CHECK(readSafetensors(path).size() == 1);
    CHECK(filesIn(dir.path) == 1);
    writeFileAtomic(path, "plain bytes");
    CHECK(testing::readBytes(path) == "plain bytes");
  }
  SECTION("a folder that does not exist") {
    std::string missing = dir.file("no/such/c.safetensors");
    CHECK_THROWS_WITH(writeSafetensors(missing, sampleTensors(), {}),
                      Contains("`" + missing + "`") && Contains("no such file or directory"));
  }
}

TEST_CASE("safetensors rejects records it cannot write", "[checkpoint]") {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  auto t = sampleTensors();
  auto withName = [&](std::string name) {
    auto v = t;
    v[2].name = std::move(name);
    return v;
  };
  CHECK_THROWS_WITH(writeSafetensors(path, withName("step"), {}),
                    Contains("tensor name `step` is used twice"));
  CHECK_THROWS_WITH(writeSafetensors(path, withName("__metadata__"), {}),
                    Contains("`__metadata__` is reserved"));
  CHECK_THROWS_WITH(writeSafetensors(path, withName(""), {}), Contains("is empty"));
  CHECK_THROWS_WITH(writeSafetensors(path, withName("bad\xff"), {}), Contains("not UTF-8"));
  auto negative = t;
  negative[0].shape = {-2, -3};
  CHECK_THROWS_WITH(writeSafetensors(path, negative, {}), Contains("F32 [-2, -3] holds 24 bytes"));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(filesIn(dir.path) == 0);
}

TEST_CASE("safetensors reading rejects every malformed file, naming it", "[checkpoint]") {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eightBytes(8, '\x01');
  auto check = [&](const std::string& file, const std::string& part) {
    testing::writeBytes(path, file);
    expectReadError(path, part);
  };

  SECTION("missing file") {
    expectReadError(dir.file("none"), "does not exist");
  }
  SECTION("a folder") {
    expectReadError(dir.path, "it is a folder");
  }
  SECTION("shorter than the length field") {
    check("abc", "it has 3 bytes, fewer than the 8 of the header length");
  }
  SECTION("header length past the file") {
    check(littleEndian64(1000) + "{}", "the header length 1,000 runs past the end of the file (10 "
                                       "bytes)");
  }
  SECTION("huge header length") {
    check(littleEndian64(~uint64_t{0}) + "{}",
          "the header length 18,446,744,073,709,551,615 runs past the end of the file");
  }
  SECTION("not JSON") {
    check(rawFile("{\"w\": [1,", ""), "the header is not valid JSON");
  }
  SECTION("not an object") {
    check(rawFile("[1, 2]  ", ""), "does not start with `{`");
  }
  SECTION("unknown dtype") {
    check(rawFile(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", eightBytes),
          "tensor `w` has dtype `F64`; EPL reads F32, F16, BF16, I32, I64 and U8");
  }
  SECTION("offsets that do not match shape x dtype") {
    check(rawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eightBytes),
          "tensor `w` has data_offsets [0, 8], but F32 [3] takes 12 bytes");
  }
  SECTION("offsets past the data") {
    check(rawFile("{" + w + "}", "1234"), "tensor `w` ends at byte 8, past the 4 bytes of data");
  }
  SECTION("reversed offsets") {
    check(rawFile(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", eightBytes),
          "tensor `w` has data_offsets [8, 0]");
  }
  SECTION("overlapping tensors") {
    check(
        rawFile("{" + w + R"(,"v":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})", eightBytes),
        "tensors `w` and `v` overlap");
  }
  SECTION("a hole between tensors") {
    check(rawFile("{" + w + R"(,"v":{"dtype":"I32","shape":[1],"data_offsets":[12,16]}})",
                  eightBytes + eightBytes),
          "4 bytes before tensor `v` belong to no tensor");
  }
  SECTION("duplicate names") {
    check(rawFile("{" + w + "," + w + "}", eightBytes), "the header names `w` twice");
  }
  SECTION("trailing garbage") {
    check(rawFile("{" + w + "}", eightBytes + "junk"),
          "4 bytes of trailing data after the last tensor");
  }
  SECTION("negative or fractional shape") {
    check(rawFile(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eightBytes),
          "has a shape entry that is not a non-negative integer");
    check(rawFile(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eightBytes),
          "has a shape entry that is not a non-negative integer");
  }
  SECTION("a shape too large to hold") {
    check(rawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                  eightBytes),
          "has a shape too large to hold");
  }
  SECTION("missing and unknown fields") {
    check(rawFile(R"({"w":{"dtype":"F32","shape":[2]}})", eightBytes),
          "tensor `w` has no `data_offsets` pair");
    check(rawFile(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eightBytes),
          "tensor `w` has unknown field `x`");
    check(rawFile(R"({"w":3})", ""), "tensor `w` is not an object");
  }
  SECTION("metadata that is not string to string") {
    check(rawFile(R"({"__metadata__":{"step":3}})", ""), "metadata `step` is not a string");
    check(rawFile(R"({"__metadata__":[]})", ""), "`__metadata__` is not an object");
  }
}

TEST_CASE("safetensors reads files padded or not, tensors in any header order", "[checkpoint]") {
  TempDir dir;
  std::string path = dir.file("p.safetensors");
  // Data order b then a, header order a then b, header not padded to 8.
  std::string header =
      R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[2,6]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} )";
  testing::writeBytes(path, rawFile(header, std::string("\x05\x06\x07\x00\x00\x00", 6)));
  auto t = readSafetensors(path);
  REQUIRE(t.size() == 2);
  CHECK(t[0].name == "b");
  CHECK(t[0].bytes == std::vector<unsigned char>{5, 6});
  CHECK(t[1].name == "a");
  CHECK(t[1].bytes == bytesOf<int32_t>({7}));
}
