// The data readers on any bytes as a data file: the first byte picks the reader (IDX images,
// IDX labels, uint16 tokens, text) and the second the window length of token and text data
// (and with its bits 5 and 6, documents ending with token 10 and their padding masks);
// the rest is the file, plain or gzip. IDX files are paired with a fixed, valid companion of
// 12 samples of 2 x 3. A malformed file must be a DataError; any other exception escapes and
// is a finding. When the file opens, a few samples of each split are read.
#include "MemoryFile.h"
#include "interp/data/Dataset.h"

#include <algorithm>

using namespace epl;
using namespace epl::data;

namespace {

constexpr uint32_t kSamples = 12;

std::string idxFile(std::vector<uint32_t> dims, unsigned char fill) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  size_t values = 1;
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      s += static_cast<char>((d >> shift) & 0xff);
    values *= d;
  }
  return s + std::string(values, static_cast<char>(fill));
}

// The companion of the fuzzed IDX file: images or labels, as a file of its own.
const std::string& companion(bool images) {
  static epl::fuzz::MemoryFile imageFile, labelFile;
  static bool written = false;
  if (!written) {
    std::string img = idxFile({kSamples, 2, 3}, 7), lab = idxFile({kSamples}, 1);
    imageFile.write(reinterpret_cast<const uint8_t*>(img.data()), img.size());
    labelFile.write(reinterpret_cast<const uint8_t*>(lab.data()), lab.size());
    written = true;
  }
  return images ? imageFile.path() : labelFile.path();
}

size_t elements(const InputSpec& in) {
  size_t n = 1;
  for (int64_t d : in.sampleShape)
    n *= static_cast<size_t>(d);
  return n;
}

// The first and last few samples of each split, into buffers sized from `inputs`.
void readSome(const Dataset& d, const std::vector<InputSpec>& inputs) {
  for (Split s : {Split::Train, Split::Validation}) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < std::min<int64_t>(d.size(s), 4); ++i)
      ids.push_back(i);
    if (d.size(s) > 4) ids.push_back(d.size(s) - 1);
    std::vector<std::vector<int32_t>> buffers; // 4 bytes a value serves f32 and i32 alike
    std::vector<void*> pointers;
    for (const auto& in : inputs) {
      buffers.emplace_back(ids.size() * elements(in));
      pointers.push_back(buffers.back().data());
    }
    std::vector<int32_t> next(ids.size() * elements(inputs[0]));
    d.read(s, ids, pointers, d.hasNextTokens() ? next.data() : nullptr);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static epl::fuzz::MemoryFile file;
  file.write(data + 2, size - 2);
  int kind = data[0] % 4;
  int64_t seq = 1 + data[1] % 32;
  ir::CallSpec spec;
  std::vector<InputSpec> inputs = {{"tokens", ir::DType::I32, {seq}}};
  if (kind < 2) {
    spec = {"idx",
            {{"images", kind == 0 ? file.path() : companion(true)},
             {"labels", kind == 1 ? file.path() : companion(false)}},
            {},
            {}};
    inputs = {{"images", ir::DType::F32, {1, 2, 3}}, {"labels", ir::DType::I32, {}}};
  } else {
    spec = {kind == 2 ? "tokens" : "text", {{"path", file.path()}}, {{"seq", double(seq)}}, {}};
    // The second byte's higher bits: documents ending with token 10, and their masks.
    if (data[1] & 32) spec.numbers["separator"] = 10;
    if (data[1] & 64 && data[1] & 32) inputs.push_back({"mask", ir::DType::I32, {seq}});
  }
  try {
    readSome(*openDataset(spec, inputs, 0, ""), inputs);
  } catch (const DataError&) {
  }
  return 0;
}
