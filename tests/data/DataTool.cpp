// Dumps what the data sources read, for python_oracle.py to compare with its own readers:
//   epl_data_tool idx OUT train|validation PIXELS IMAGES LABELS [TEST_IMAGES TEST_LABELS]
//     writes OUT.f32 (every sample's pixels, in id order) and OUT.i32 (labels)
//   epl_data_tool tokens|text OUT train|validation PATH SEQ VAL_FRACTION
//     writes OUT.in.i32 (every window's input) and OUT.next.i32 (its next-token targets)
// and prints "train_size validation_size max_token" on stdout.
#include "interp/data/Dataset.h"

#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>

using namespace epl;
using namespace epl::data;

namespace {

template <typename T> void append(const std::string& path, const std::vector<T>& v) {
  std::ofstream(path, std::ios::binary | std::ios::app)
      .write(reinterpret_cast<const char*>(v.data()),
             static_cast<std::streamsize>(v.size() * sizeof(T)));
}

// Reads every sample of `split` in chunks, handing each chunk's buffers to `sink`.
void readAll(const Dataset& d, Split split, const std::vector<int64_t>& perSample, bool next,
             const std::function<void(std::vector<std::vector<int32_t>>&, int64_t)>& sink) {
  const int64_t chunk = 1000;
  for (int64_t first = 0; first < d.size(split); first += chunk) {
    std::vector<int64_t> ids(static_cast<size_t>(std::min(chunk, d.size(split) - first)));
    std::iota(ids.begin(), ids.end(), first);
    // int32 storage serves f32 too: both are 4 bytes a value.
    std::vector<std::vector<int32_t>> buffers;
    buffers.reserve(perSample.size() + 1);
    for (int64_t n : perSample)
      buffers.emplace_back(ids.size() * static_cast<size_t>(n));
    if (next) buffers.emplace_back(ids.size() * static_cast<size_t>(perSample[0]));
    std::vector<void*> inputs;
    inputs.reserve(perSample.size());
    for (size_t i = 0; i < perSample.size(); ++i)
      inputs.push_back(buffers[i].data());
    d.read(split, ids, inputs, next ? buffers.back().data() : nullptr);
    sink(buffers, static_cast<int64_t>(ids.size()));
  }
}

int run(const std::vector<std::string>& a) {
  const std::string &kind = a.at(0), &out = a.at(1);
  Split split = a.at(2) == "train" ? Split::Train : Split::Validation;
  ir::CallSpec spec{kind, {}, {}, {}};
  std::vector<InputSpec> inputs;
  if (kind == "idx") {
    int64_t pixels = std::stoll(a.at(3));
    spec.strings = {{"images", a.at(4)}, {"labels", a.at(5)}};
    if (a.size() == 8) {
      spec.strings["test_images"] = a[6];
      spec.strings["test_labels"] = a[7];
    }
    inputs = {{"images", ir::DType::F32, {pixels}}, {"labels", ir::DType::I32, {}}};
  } else {
    int64_t seq = std::stoll(a.at(4));
    spec.strings = {{"path", a.at(3)}};
    spec.numbers = {{"seq", static_cast<double>(seq)}, {"val_fraction", std::stod(a.at(5))}};
    inputs = {{"tokens", ir::DType::I32, {seq}}};
  }
  auto d = openDataset(spec, inputs, 0, "");
  std::vector<int64_t> perSample;
  perSample.reserve(inputs.size());
  for (const auto& in : inputs)
    perSample.push_back(in.sampleShape.empty() ? 1 : in.sampleShape[0]);
  bool isIdx = kind == "idx";
  for (const char* suffix : {".f32", ".i32", ".in.i32", ".next.i32"})
    std::ofstream(out + suffix, std::ios::binary | std::ios::trunc);
  readAll(*d, split, perSample, !isIdx, [&](std::vector<std::vector<int32_t>>& b, int64_t) {
    append(out + (isIdx ? ".f32" : ".in.i32"), b[0]);
    append(out + (isIdx ? ".i32" : ".next.i32"), b[1]);
  });
  std::cout << d->size(Split::Train) << " " << d->size(Split::Validation) << " " << d->maxToken()
            << "\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return run(args);
  } catch (const DataError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "usage: see the comment at the top of DataTool.cpp (" << e.what() << ")\n";
    return 2;
  }
}
