// openDataset: the dispatch on the data call's kind, and the checks every source shares.
#include "interp/data/Dataset.h"

#include "interp/data/Sources.h"
#include "support/Assert.h"

#include <fmt/format.h>

#include <cmath>

namespace epl::data {

Dataset::~Dataset() = default;
bool Dataset::hasNextTokens() const {
  return false;
}
int64_t Dataset::maxToken() const {
  return -1;
}
int64_t Dataset::maxValue(size_t) const {
  return -1;
}

int64_t Dataset::maxLabel() const {
  return -1;
}

std::unique_ptr<Dataset> openDataset(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                     uint64_t seed, const std::string& baseDir) {
  if (spec.kind == "idx") return openIdx(spec, inputs, baseDir);
  if (spec.kind == "tokens") return openTokens(spec, inputs, baseDir, false);
  if (spec.kind == "text") return openTokens(spec, inputs, baseDir, true);
  if (spec.kind == "synthetic") return openSynthetic(spec, inputs, seed);
  if (spec.kind.empty()) throw DataError("no `data` source given");
  throw DataError(fmt::format("unknown data source `{}`", spec.kind));
}

std::string stringArg(const ir::CallSpec& spec, const std::string& name) {
  auto it = spec.strings.find(name);
  if (it == spec.strings.end() || it->second.empty())
    throw DataError(fmt::format("`{}` needs `{}`", spec.kind, name));
  return it->second;
}

std::string optionalStringArg(const ir::CallSpec& spec, const std::string& name) {
  auto it = spec.strings.find(name);
  return it == spec.strings.end() ? "" : it->second;
}

int64_t integerArg(const ir::CallSpec& spec, const std::string& name, int64_t fallback,
                   int64_t min) {
  auto it = spec.numbers.find(name);
  if (it == spec.numbers.end()) {
    if (fallback < 0) throw DataError(fmt::format("`{}` needs `{}`", spec.kind, name));
    return fallback;
  }
  double v = it->second;
  if (!(v >= static_cast<double>(min)) || v > 9e15 || v != std::floor(v))
    throw DataError(fmt::format("argument `{}` of `{}` must be an integer >= {}, got {}", name,
                                spec.kind, min, v));
  return static_cast<int64_t>(v);
}

double numberArg(const ir::CallSpec& spec, const std::string& name, double fallback) {
  auto it = spec.numbers.find(name);
  return it == spec.numbers.end() ? fallback : it->second;
}

std::string inputDecl(const InputSpec& in) {
  std::string dims = "B";
  for (int64_t d : in.sampleShape)
    dims += fmt::format(", {}", d);
  return fmt::format("`{}: {}[{}]`", in.name, ir::dtypeName(in.dtype), dims);
}

int64_t sampleElements(const InputSpec& in) {
  int64_t n = 1;
  for (int64_t d : in.sampleShape) {
    if (d < 0 || (d > 0 && n > INT64_MAX / d))
      throw DataError(fmt::format("model input {} has an invalid shape", inputDecl(in)));
    n *= d;
  }
  return n;
}

std::string inputNames(const std::vector<InputSpec>& inputs) {
  std::string out;
  for (const auto& in : inputs)
    out += (out.empty() ? "`" : ", `") + in.name + "`";
  return out.empty() ? "none" : out;
}

void checkInputDTypes(const std::string& source, const std::vector<InputSpec>& inputs) {
  for (const auto& in : inputs) {
    if (in.dtype == ir::DType::F32 || in.dtype == ir::DType::I32) continue;
    bool integral = ir::isIntegral(in.dtype);
    throw DataError(fmt::format("model input {} is {}; `{}` data writes {} inputs as {}",
                                inputDecl(in), ir::dtypeName(in.dtype), source,
                                integral ? "integer" : "float", integral ? "i32" : "f32"));
  }
}

void checkRead(const std::vector<int64_t>& ids, int64_t size, const std::vector<void*>& inputs,
               size_t inputCount) {
  EPL_ASSERT(inputs.size() == inputCount, "one buffer per model input");
  for (int64_t id : ids)
    EPL_ASSERT(id >= 0 && id < size, "sample id outside its split");
}

std::string dimsStr(const std::vector<int64_t>& dims) {
  std::string out;
  for (int64_t d : dims)
    out += (out.empty() ? "" : " x ") + std::to_string(d);
  return out;
}

} // namespace epl::data
