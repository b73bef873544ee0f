// Drives the safetensors reader and writer for torch_interop.py:
//   epl_safetensors_tool write PATH   writes the fixed tensors below
//   epl_safetensors_tool dump PATH    reads PATH and prints its tensors' values as JSON
#include "interp/checkpoint/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <iostream>

using namespace epl;
using namespace epl::checkpoint;
using nlohmann::json;

namespace {

template <typename T> std::vector<unsigned char> bytesOf(const std::vector<T>& values) {
  std::vector<unsigned char> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T> T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float fromBf16(uint16_t bits) {
  return load<float>(bytesOf<uint32_t>({uint32_t(bits) << 16}).data());
}

// IEEE half to float, subnormals and infinities included.
float fromF16(uint16_t h) {
  int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float v;
  if (exponent == 0)
    v = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31)
    v = mantissa ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  return sign ? -v : v;
}

// The values torch_interop.py expects, dtype by dtype (special values included).
int write(const std::string& path) {
  std::vector<TensorRecord> t = {
      {"weight",
       ir::DType::F32,
       {2, 3},
       bytesOf<float>({-1.5f, 0.25f, 0x1p100f, -0.0f, 0x1p-149f, 7.0f})},
      {"step", ir::DType::I64, {}, bytesOf<int64_t>({123456789012})},
      {"ids", ir::DType::I32, {4}, bytesOf<int32_t>({-1, 0, 7, 2147483647})},
      {"half", ir::DType::F16, {3}, bytesOf<uint16_t>({0x3c00, 0xc100, 0x7bff})},
      {"brain", ir::DType::BF16, {2, 2}, bytesOf<uint16_t>({0x3f80, 0xc000, 0x3f00, 0x4049})},
      {"raw", TensorDType::u8(), {5}, {0, 1, 127, 128, 255}},
      {"empty", ir::DType::F32, {0, 4}, {}},
  };
  writeSafetensors(path, t, {{"format", "pt"}, {"step", "42"}, {"note", "ünïcode"}});
  return 0;
}

json values(const TensorRecord& t) {
  json out = json::array();
  const unsigned char* p = t.bytes.data();
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (t.dtype.isU8()) {
      out.push_back(p[i]);
      continue;
    }
    switch (*t.dtype.irDType()) {
    case ir::DType::F32:
      out.push_back(load<float>(p + 4 * i));
      break;
    case ir::DType::F16:
      out.push_back(fromF16(load<uint16_t>(p + 2 * i)));
      break;
    case ir::DType::BF16:
      out.push_back(fromBf16(load<uint16_t>(p + 2 * i)));
      break;
    case ir::DType::I32:
      out.push_back(load<int32_t>(p + 4 * i));
      break;
    case ir::DType::I64:
      out.push_back(load<int64_t>(p + 8 * i));
      break;
    }
  }
  return out;
}

int dump(const std::string& path) {
  std::map<std::string, std::string> metadata;
  auto tensors = readSafetensors(path, &metadata);
  json out = {{"metadata", metadata}, {"tensors", json::array()}};
  for (const auto& t : tensors)
    out["tensors"].push_back(
        {{"name", t.name}, {"dtype", t.dtype.name()}, {"shape", t.shape}, {"values", values(t)}});
  std::cout << out.dump() << "\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: epl_safetensors_tool write|dump PATH\n";
    return 2;
  }
  std::string command = argv[1];
  try {
    if (command == "write") return write(argv[2]);
    if (command == "dump") return dump(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "unknown command `" << command << "`\n";
  return 2;
}
