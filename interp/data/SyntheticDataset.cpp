// `synthetic(samples, classes = 10)`: seeded random data for any model. Float inputs are
// N(0, 1), integer inputs uniform in [0, n): n is `classes`, or fewer when the layers that
// read the input accept fewer (a segment embedding of 2, a 4-class loss). Every value is a pure
// function of (seed, sample id, input, element), so batching, ranks and resumption never change a
// sample. Validation holds ceil(samples / 10) further samples, ids samples.. onwards.
#include "interp/data/Sources.h"
#include "support/Random.h"
#include "support/Text.h"

#include <fmt/format.h>

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
      for (size_t i = 0; i < ids.size(); ++i) {
        uint64_t sample = globalId(s, ids[i]);
        int64_t at = static_cast<int64_t>(i) * n;
        for (int64_t j = 0; j < n; ++j) {
          uint64_t h = hash(sample, k, static_cast<uint64_t>(j));
          if (integral)
            static_cast<int32_t*>(inputs[k])[at + j] = integer(h, range_[k]);
          else
            static_cast<float*>(inputs[k])[at + j] = normal(h);
        }
        // The token input's window continues one element further for `next(tokens)`.
        if (next && hasNext_ && k == tokenInput_) {
          int32_t* row = static_cast<int32_t*>(inputs[k]) + at;
          std::copy(row + 1, row + n, next + at);
          next[at + n - 1] = integer(hash(sample, k, static_cast<uint64_t>(n)), range_[k]);
        }
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
  uint64_t hash(uint64_t sample, uint64_t input, uint64_t element) const {
    return splitmix64(splitmix64(splitmix64(splitmix64(seed_) ^ sample) ^ input) ^ element);
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
