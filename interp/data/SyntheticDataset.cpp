// `synthetic(samples, classes = 10)`: seeded random data for any model. Float inputs are
// N(0, 1), integer inputs uniform in [0, n): n is `classes`, or fewer when the layers that
// read the input accept fewer (a segment embedding of 2, a 4-class loss). Every value is a pure
// function of (seed, sample id, input, element), so batching, ranks and resumption never change a
// sample. Validation holds ceil(samples / 10) further samples, ids samples.. onwards.
#include "backend/cpu/Parallel.h"
#include "interp/data/Sources.h"
#include "support/Random.h"
#include "support/Text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace epl::data {

namespace {

class SyntheticDataset final : public Dataset {
public:
  SyntheticDataset(std::vector<InputSpec> inputs, int64_t samples, int64_t classes, uint64_t seed)
      : inputs_(std::move(inputs)), samples_(samples), classes_(classes), seed_(seed) {
    for (size_t i = 0; i < inputs_.size(); ++i) {
      int64_t accepts = inputs_[i].accepts;
      range_.push_back(accepts > 0 ? std::min(classes_, accepts) : classes_);
      if (!ir::isIntegral(inputs_[i].dtype)) continue;
      ++integerInputs_;
      tokenInput_ = i;
    }
    hasNext_ = integerInputs_ == 1 && inputs_[tokenInput_].sampleShape.size() == 1;
  }

  int64_t size(Split s) const override {
    return s == Split::Train ? samples_ : (samples_ + 9) / 10;
  }
  bool hasNextTokens() const override { return hasNext_; }
  int64_t maxToken() const override { return integerInputs_ > 0 ? classes_ - 1 : -1; }
  int64_t maxLabel() const override { return maxToken(); }
  int64_t maxValue(size_t input) const override {
    return input < inputs_.size() && ir::isIntegral(inputs_[input].dtype) ? range_[input] - 1 : -1;
  }

  void read(Split s, const std::vector<int64_t>& ids, const std::vector<void*>& inputs,
            int32_t* next) const override {
    checkRead(ids, size(s), inputs, inputs_.size());
    for (size_t k = 0; k < inputs_.size(); ++k) {
      int64_t n = sampleElements(inputs_[k]);
      bool integral = ir::isIntegral(inputs_[k].dtype);
      // Every element is its own hash's, so the pool's threads take runs of the batch's
      // elements in any order (a normal's logarithm and cosine make it a few tens of ns).
      auto elements = static_cast<int64_t>(ids.size()) * n;
      backend::cpu::parallelFor(elements, 8192, [&](int64_t begin, int64_t end) {
        for (int64_t e = begin; e < end;) {
          int64_t i = e / n, j = e % n, stop = std::min(end, (i + 1) * n);
          uint64_t prefix = samplePrefix(globalId(s, ids[static_cast<size_t>(i)]), k);
          if (integral) {
            auto* out = static_cast<int32_t*>(inputs[k]);
            for (; e < stop; ++e, ++j)
              out[e] = integer(splitmix64(prefix ^ static_cast<uint64_t>(j)), range_[k]);
          } else {
            auto* out = static_cast<float*>(inputs[k]);
            for (; e < stop; ++e, ++j)
              out[e] = normal(splitmix64(prefix ^ static_cast<uint64_t>(j)));
          }
        }
      });
      // The token input's window continues one element further for `next(tokens)`.
      if (next && hasNext_ && k == tokenInput_)
        for (size_t i = 0; i < ids.size(); ++i) {
          int64_t at = static_cast<int64_t>(i) * n;
          int32_t* row = static_cast<int32_t*>(inputs[k]) + at;
          std::copy(row + 1, row + n, next + at);
          uint64_t prefix = samplePrefix(globalId(s, ids[i]), k);
          next[at + n - 1] = integer(splitmix64(prefix ^ static_cast<uint64_t>(n)), range_[k]);
        }
    }
  }

  std::string describe() const override {
    std::vector<std::string> fewer; // integer inputs drawn from fewer values than `classes`
    for (size_t i = 0; i < inputs_.size(); ++i)
      if (ir::isIntegral(inputs_[i].dtype) && range_[i] < classes_)
        fewer.push_back(fmt::format("`{}` below {}", inputs_[i].name, range_[i]));
    return fmt::format("synthetic: {} train / {} validation samples, seed {}{}{}",
                       withCommas(samples_), withCommas(size(Split::Validation)), seed_,
                       integerInputs_ > 0 ? fmt::format(", {} classes", classes_) : "",
                       fewer.empty() ? ""
                                     : fmt::format(" ({}: what the layers reading them accept)",
                                                   fmt::join(fewer, ", ")));
  }

private:
  uint64_t globalId(Split s, int64_t id) const {
    return static_cast<uint64_t>(s == Split::Train ? id : samples_ + id);
  }
  // An element's hash is splitmix64(prefix ^ element), the prefix of its sample and input.
  uint64_t samplePrefix(uint64_t sample, uint64_t input) const {
    return splitmix64(splitmix64(splitmix64(seed_) ^ sample) ^ input);
  }
  static int32_t integer(uint64_t h, int64_t range) {
    return static_cast<int32_t>(((h >> 32) * static_cast<uint64_t>(range)) >> 32);
  }
  // Box-Muller from two 53-bit uniforms; u1 in (0, 1] keeps the log finite.
  static float normal(uint64_t h) {
    double u1 = static_cast<double>((h >> 11) + 1) * 0x1p-53;
    double u2 = static_cast<double>(splitmix64(h) >> 11) * 0x1p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }

  std::vector<InputSpec> inputs_;
  std::vector<int64_t> range_; // by input: values an integer input draws from
  int64_t samples_, classes_;
  uint64_t seed_;
  int integerInputs_ = 0;
  size_t tokenInput_ = 0;
  bool hasNext_ = false;
};

} // namespace

std::unique_ptr<Dataset> openSynthetic(const ir::CallSpec& spec,
                                       const std::vector<InputSpec>& inputs, uint64_t seed) {
  int64_t samples = integerArg(spec, "samples", -1, 1);
  int64_t classes = integerArg(spec, "classes", 10, 1);
  if (classes > INT32_MAX)
    throw DataError(fmt::format("argument `classes` of `synthetic` must be at most {}, got {}",
                                INT32_MAX, classes));
  if (inputs.empty()) throw DataError("`synthetic` data needs a model input; the model takes none");
  checkInputDTypes("synthetic", inputs);
  for (const auto& in : inputs)
    sampleElements(in); // rejects negative dims
  return std::make_unique<SyntheticDataset>(inputs, samples, classes, seed);
}

} // namespace epl::data
